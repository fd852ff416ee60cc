// The Java client over a SASL listener, for pykbroker's integration tests (test_sasl_listeners.py), run as a
// single-file source program (Java 11+) with the Java client 3.9 of the reference kit on the class path:
//
//   java -cp '../shared/refkit/java-client/lib/*' SaslClient.java BOOTSTRAP TOPIC COUNT KEY=VALUE...
//
// The KEY=VALUE pairs are client settings (security.protocol, sasl.mechanism, sasl.jaas.config, ssl.*), except
// pause.ms=N: wait N ms after each send (to outlive a SASL session). A KafkaProducer (its defaults: idempotent,
// acks=all) sends java-0..COUNT-1 to TOPIC; a KafkaConsumer (a new group, from the beginning) reads them back,
// printing "read VALUE" per record. Exit 0, or the exception and exit 1.

import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.UUID;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class SaslClient {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        int count = Integer.parseInt(args[2]);
        Properties common = new Properties();
        common.put("bootstrap.servers", bootstrap);
        for (int i = 3; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            common.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        long pauseMs = Long.parseLong((String) common.getOrDefault("pause.ms", "0"));
        common.remove("pause.ms");
        Properties producerProps = new Properties();
        producerProps.putAll(common);
        producerProps.put("key.serializer", StringSerializer.class.getName());
        producerProps.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps)) {
            for (int i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, "java-" + i)).get();
                Thread.sleep(pauseMs);
            }
        }
        Properties consumerProps = new Properties();
        consumerProps.putAll(common);
        consumerProps.put("group.id", "sasl-java-" + UUID.randomUUID());
        consumerProps.put("auto.offset.reset", "earliest");
        consumerProps.put("key.deserializer", StringDeserializer.class.getName());
        consumerProps.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerProps)) {
            consumer.subscribe(List.of(topic));
            int read = 0;
            long deadline = System.currentTimeMillis() + 60_000;
            while (read < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(500))) {
                    System.out.println("read " + record.value());
                    read++;
                }
            }
        }
    }
}
