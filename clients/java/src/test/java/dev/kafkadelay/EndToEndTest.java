package dev.kafkadelay;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.ServerSocket;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.function.Predicate;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * End to end with kafka-clients against a real Kafka and the kafka-delay binary (mvn test
 * -Dgroups=e2e with KAFKA_DELAY_TEST_BROKERS and KAFKA_DELAY_BIN; scripts/test-external.sh
 * sets both): a delayed record and a retry built by the helper arrive when due.
 */
@Tag("e2e")
class EndToEndTest {
    /** The broker's data dir, removed by JUnit after the test. */
    @TempDir
    Path dataDir;

    static String header(ConsumerRecord<byte[], byte[]> r, String name) {
        Header h = r.headers().lastHeader(name);
        return h == null ? null : new String(h.value(), UTF_8);
    }

    static ConsumerRecord<byte[], byte[]> next(KafkaConsumer<byte[], byte[]> c, Predicate<ConsumerRecord<byte[], byte[]>> want) {
        long deadline = System.currentTimeMillis() + 60_000;
        while (System.currentTimeMillis() < deadline) {
            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                if (want.test(r)) return r;
            }
        }
        throw new AssertionError("no such record within 60 s");
    }

    @Test
    void aDelayedRecordAndARetryArriveWhenDue() throws Exception {
        String brokers = System.getenv("KAFKA_DELAY_TEST_BROKERS"), bin = System.getenv("KAFKA_DELAY_BIN");
        assertNotNull(brokers, "set KAFKA_DELAY_TEST_BROKERS (scripts/test-external.sh does)");
        assertNotNull(bin, "set KAFKA_DELAY_BIN (scripts/test-external.sh does)");
        String run = "java_" + Long.toString(System.nanoTime() % 1_000_000_000L);
        String delay = "delay." + run + ".in", retryTopic = "delay." + run + ".retry", target = "out-" + run, dlt = "dlt-" + run;
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", brokers))) {
            admin.createTopics(List.of(new NewTopic(delay, 1, (short) 1), new NewTopic(retryTopic, 1, (short) 1),
                    new NewTopic(target, 1, (short) 1), new NewTopic(dlt, 1, (short) 1))).all().get();
        }
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        Process broker = new ProcessBuilder(bin, "run", "--brokers", brokers,
                "--data-dir", dataDir.toString(), "--http-addr", "127.0.0.1:" + port,
                "--group-id", "g-" + run, "--instance-id", "i-" + run, "--source-pattern", "^delay\\." + run + "\\..+",
                "--retry-topics", "^delay\\." + run + "\\.retry$", "--dead-letter-topic", dlt, "--topic-refresh", "500ms")
                .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        Map<String, Object> pc = Map.of("bootstrap.servers", brokers, "key.serializer", ByteArraySerializer.class.getName(),
                "value.serializer", ByteArraySerializer.class.getName());
        Map<String, Object> cc = Map.of("bootstrap.servers", brokers, "key.deserializer", ByteArrayDeserializer.class.getName(),
                "value.deserializer", ByteArrayDeserializer.class.getName(), "enable.auto.commit", "false");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pc);
             KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cc)) {
            ShareGroupTest.waitReady(broker, port);
            TopicPartition tp = new TopicPartition(target, 0);
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));

            long sent = System.currentTimeMillis();
            producer.send(KafkaDelay.delayed(delay, target, "k1".getBytes(UTF_8), "hello".getBytes(UTF_8))
                    .after(Duration.ofSeconds(2)).header("trace-id", "t-1".getBytes(UTF_8)).build()).get();
            ConsumerRecord<byte[], byte[]> got = next(consumer, r -> "k1".equals(new String(r.key(), UTF_8)));
            long due = Long.parseLong(header(got, KafkaDelay.DUE_MS));
            assertTrue(due >= sent + 2_000 - 50, "due 2 s after the record's timestamp");
            assertTrue(Long.parseLong(header(got, KafkaDelay.FIRED_MS)) >= due, "never early");
            assertEquals("t-1", header(got, "trace-id"));
            assertEquals(0, KafkaDelay.attempt(got));

            long retriedAt = System.currentTimeMillis();
            producer.send(KafkaDelay.retry(got).topic(retryTopic).after(Duration.ofSeconds(2)).reason("inventory 503").build()).get();
            ConsumerRecord<byte[], byte[]> back = next(consumer,
                    r -> "k1".equals(new String(r.key(), UTF_8)) && header(r, KafkaDelay.RETRY_ATTEMPT) != null);
            assertEquals(1, KafkaDelay.attempt(back));
            assertTrue(Long.parseLong(header(back, KafkaDelay.DUE_MS)) >= retriedAt + 2_000 - 50);
            assertTrue(Long.parseLong(header(back, KafkaDelay.FIRED_MS)) >= Long.parseLong(header(back, KafkaDelay.DUE_MS)));
            assertEquals("t-1", header(back, "trace-id"));
            assertEquals("inventory 503", header(back, KafkaDelay.RETRY_REASON));
        } finally {
            broker.destroyForcibly().waitFor();
        }
    }
}
