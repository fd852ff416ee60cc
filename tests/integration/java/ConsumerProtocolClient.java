// A KafkaConsumer of the consumer group protocol (KIP-848, group.protocol=consumer) for pykbroker's integration
// tests (test_consumer_protocol_java.py), run as a single-file source program (Java 11+) with the Java client 3.9
// of the reference kit on the class path:
//
//   java -cp '../shared/refkit/java-client/lib/*' ConsumerProtocolClient.java BOOTSTRAP GROUP TOPIC COUNT
//
// Subscribes to TOPIC in GROUP, reads until it has COUNT records, committing synchronously after each poll, then
// closes (leaving the group). Prints "assigned TOPIC-PARTITION" per partition given, "read VALUE" per record and
// "member MEMBER_ID" once. Exit 0, or an exception's stack trace and exit 1.

import java.time.Duration;
import java.util.Collection;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

public class ConsumerProtocolClient {
    public static void main(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", args[1]);
        props.put("group.protocol", "consumer");
        props.put("auto.offset.reset", "earliest");
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        int want = Integer.parseInt(args[3]);
        int read = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(args[2]), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) { }

                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    for (TopicPartition tp : partitions) System.out.println("assigned " + tp);
                }
            });
            long deadline = System.currentTimeMillis() + 60_000;
            while (read < want) {
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("read " + read + " of " + want);
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    System.out.println("read " + record.value());
                    read++;
                }
                consumer.commitSync();
            }
            System.out.println("member " + consumer.groupMetadata().memberId());
        } catch (Exception e) {
            e.printStackTrace();
            System.exit(1);
        }
    }
}
