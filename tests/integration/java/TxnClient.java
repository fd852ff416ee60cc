// The Java client's transactions for pykbroker's integration tests (test_transactions_clients.py), run as a
// single-file source program (Java 11+), with the Java client 3.9 of the reference kit on the class path:
//
//   java -cp '../shared/refkit/java-client/lib/*' TxnClient.java BOOTSTRAP TOPIC TRANSACTIONAL_ID IN_TOPIC GROUP QUIET_MS
//
// A transactional KafkaProducer commits java-commit-0..3 (partitions 0,1,0,1) with the offset 4 of IN_TOPIC-0 for
// GROUP (sendOffsetsToTransaction), then aborts java-abort-0..1 with the offset 6; a read_committed KafkaConsumer
// reads TOPIC from the beginning until it has 4 records and QUIET_MS passed with nothing more, printing
// "read VALUE" per record. Exit 0, or an exception's stack trace and exit 1.

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnClient {
    /** Begin a transaction: PREFIX0..PREFIX(n-1) to partitions 0,1,0,1..., the group's offset of IN_TOPIC-0. */
    static void transaction(KafkaProducer<String, String> producer, String topic, String prefix, int n, String inTopic,
                            String group, long offset) {
        producer.beginTransaction();
        for (int i = 0; i < n; i++) {
            producer.send(new ProducerRecord<>(topic, i % 2, null, prefix + i));
        }
        producer.sendOffsetsToTransaction(Map.of(new TopicPartition(inTopic, 0), new OffsetAndMetadata(offset)),
                                          new ConsumerGroupMetadata(group));
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], transactionalId = args[2], inTopic = args[3], group = args[4];
        long quietMs = Long.parseLong(args[5]);

        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("transactional.id", transactionalId);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            transaction(producer, topic, "java-commit-", 4, inTopic, group, 4);
            producer.commitTransaction();
            transaction(producer, topic, "java-abort-", 2, inTopic, group, 6);
            producer.flush();
            producer.abortTransaction();
        }

        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("isolation.level", "read_committed");
        c.put("enable.auto.commit", "false");
        c.put("fetch.max.wait.ms", "100");
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        List<String> read = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            List<TopicPartition> partitions = List.of(new TopicPartition(topic, 0), new TopicPartition(topic, 1));
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            long deadline = System.currentTimeMillis() + 60_000, lastAt = System.currentTimeMillis();
            while (System.currentTimeMillis() < deadline
                   && !(read.size() >= 4 && System.currentTimeMillis() - lastAt >= quietMs)) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    read.add(record.value());
                    lastAt = System.currentTimeMillis();
                }
            }
        }
        for (String value : read) {
            System.out.println("read " + value);
        }
    }
}
