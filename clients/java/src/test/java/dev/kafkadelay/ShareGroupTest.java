package dev.kafkadelay;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Delayed retries for a share group (KIP-932) through kafka-delay, on a Kafka that serves share
 * groups (4.2 and newer; the suite's broker) with the kafka-delay binary (KAFKA_DELAY_TEST_BROKERS
 * and KAFKA_DELAY_BIN, as {@link EndToEndTest}). Every time is the test's own clock: a record
 * back early is one received before its failure plus its retry-after; duplicates are counted on
 * the topic itself, read from its start, after the last retry could have fired.
 */
@Tag("e2e")
class ShareGroupTest {
    @TempDir
    Path dataDir;

    static final Duration FLAKY_AFTER = Duration.ofSeconds(2);
    static final Duration CRASH_AFTER = Duration.ofSeconds(6);
    static final Duration DOOMED_AFTER = Duration.ofSeconds(1);

    static String key(ConsumerRecord<byte[], byte[]> r) {
        return new String(r.key(), UTF_8);
    }

    static String header(ConsumerRecord<byte[], byte[]> r, String name) {
        Header h = r.headers().lastHeader(name);
        return h == null ? null : new String(h.value(), UTF_8);
    }

    static KafkaShareConsumer<byte[], byte[]> shareConsumer(String brokers, String group, String topic) {
        KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(Map.of("bootstrap.servers", brokers,
                "group.id", group, "share.acknowledgement.mode", "explicit",
                "key.deserializer", ByteArrayDeserializer.class.getName(),
                "value.deserializer", ByteArrayDeserializer.class.getName()));
        c.subscribe(List.of(topic));
        return c;
    }

    static void waitReady(Process broker, int port) throws Exception {
        HttpClient http = HttpClient.newHttpClient();
        long readyBy = System.currentTimeMillis() + 60_000;
        while (true) {
            assertTrue(broker.isAlive(), "kafka-delay exited");
            try {
                if (http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/readyz")).build(),
                        HttpResponse.BodyHandlers.discarding()).statusCode() == 200) return;
            } catch (java.io.IOException e) {
                // not listening yet
            }
            assertTrue(System.currentTimeMillis() < readyBy, "kafka-delay not ready within 60 s");
            Thread.sleep(100);
        }
    }

    /** Every record of a topic from its start, as a read_committed consumer sees it. */
    static List<ConsumerRecord<byte[], byte[]>> readAll(String brokers, String topic) {
        Map<String, Object> cc = Map.of("bootstrap.servers", brokers, "isolation.level", "read_committed",
                "key.deserializer", ByteArrayDeserializer.class.getName(),
                "value.deserializer", ByteArrayDeserializer.class.getName(), "enable.auto.commit", "false");
        List<ConsumerRecord<byte[], byte[]>> all = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cc)) {
            TopicPartition tp = new TopicPartition(topic, 0);
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            long end = c.endOffsets(List.of(tp)).get(tp);
            long deadline = System.currentTimeMillis() + 30_000;
            while (c.position(tp) < end && System.currentTimeMillis() < deadline) {
                c.poll(Duration.ofMillis(200)).forEach(all::add);
            }
            assertEquals(end, c.position(tp), topic + " not read to its end within 30 s");
        }
        return all;
    }

    @Test
    void aShareConsumersFailedRecordsComeBackAfterTheirRetryAfterOnceEvenAcrossACrashThenDeadLetteredOnce()
            throws Exception {
        String brokers = System.getenv("KAFKA_DELAY_TEST_BROKERS"), bin = System.getenv("KAFKA_DELAY_BIN");
        assertNotNull(brokers, "set KAFKA_DELAY_TEST_BROKERS (scripts/test-external.sh does)");
        assertNotNull(bin, "set KAFKA_DELAY_BIN (scripts/test-external.sh does)");
        String run = "share_" + Long.toString(System.nanoTime() % 1_000_000_000L);
        String work = "work-" + run, retryTopic = "delay." + run + ".retry", dlt = "dlt-" + run, group = "g-" + run;
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", brokers))) {
            admin.createTopics(List.of(new NewTopic(work, 1, (short) 1), new NewTopic(retryTopic, 1, (short) 1),
                    new NewTopic(dlt, 1, (short) 1))).all().get();
            // A share group starts at the log's end unless told otherwise (a group config).
            admin.incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, group),
                    List.of(new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
                            AlterConfigOp.OpType.SET)))).all().get();
        }
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        Process broker = new ProcessBuilder(bin, "run", "--brokers", brokers,
                "--data-dir", dataDir.toString(), "--http-addr", "127.0.0.1:" + port,
                "--group-id", "kd-" + run, "--instance-id", "i-" + run, "--source-pattern", "^delay\\." + run + "\\..+",
                "--retry-topics", "^delay\\." + run + "\\.retry$", "--topic-refresh", "500ms",
                "--retry-policy", "^" + work + "$=backoff=fixed,delay=1s,max-attempts=2,dead-letter=" + dlt)
                .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        Map<String, Object> pc = Map.of("bootstrap.servers", brokers, "key.serializer", ByteArraySerializer.class.getName(),
                "value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pc)) {
            waitReady(broker, port);

            // A consumer that dies between its retry's send and its acknowledgement: the retry is
            // in Kafka, the record is not acknowledged, and the share group delivers it again.
            producer.send(new ProducerRecord<>(work, "crash".getBytes(UTF_8), "c".getBytes(UTF_8))).get();
            long crashFailedAt;
            try (KafkaShareConsumer<byte[], byte[]> dying = shareConsumer(brokers, group, work)) {
                ConsumerRecord<byte[], byte[]> first = null;
                long deadline = System.currentTimeMillis() + 60_000;
                while (first == null) {
                    assertTrue(System.currentTimeMillis() < deadline, "the share group delivered nothing in 60 s");
                    for (ConsumerRecord<byte[], byte[]> r : dying.poll(Duration.ofMillis(200))) first = r;
                }
                assertEquals("crash", key(first));
                crashFailedAt = System.currentTimeMillis();
                producer.send(KafkaDelay.retry(first).topic(retryTopic).after(CRASH_AFTER).forShareGroup(producer)).get();
                // no acknowledgement: closing releases the record, as a dead consumer's lock expiring would
            }

            producer.send(new ProducerRecord<>(work, "flaky".getBytes(UTF_8), "f".getBytes(UTF_8))).get();
            producer.send(new ProducerRecord<>(work, "doomed".getBytes(UTF_8), "d".getBytes(UTF_8))).get();

            Map<String, Long> failedAt = new HashMap<>(Map.of("crash", crashFailedAt));
            Map<String, List<Integer>> seen = new HashMap<>();
            List<String> processed = new ArrayList<>();
            Optional<Short> crashRedelivery = Optional.empty();
            try (KafkaShareConsumer<byte[], byte[]> consumer = shareConsumer(brokers, group, work)) {
                long deadline = System.currentTimeMillis() + 90_000;
                // until flaky and crash are processed and doomed has failed its third time
                while (processed.size() < 2 || seen.getOrDefault("doomed", List.of()).size() < 3) {
                    assertTrue(System.currentTimeMillis() < deadline,
                            "not done in 90 s: seen " + seen + ", processed " + processed);
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                        long now = System.currentTimeMillis();
                        String k = key(r);
                        int attempt = KafkaDelay.attempt(r);
                        seen.computeIfAbsent(k, x -> new ArrayList<>()).add(attempt);
                        Duration after = switch (k) {
                            case "flaky" -> FLAKY_AFTER;
                            case "crash" -> CRASH_AFTER;
                            default -> DOOMED_AFTER;
                        };
                        if (attempt > 0) {
                            long waited = now - failedAt.get(k);
                            assertTrue(waited >= after.toMillis(),
                                    k + " attempt " + attempt + " back " + waited + " ms after its failure, before its retry-after");
                        }
                        boolean fails = switch (k) {
                            case "flaky" -> attempt < 2;
                            case "crash" -> attempt == 0;
                            default -> true;
                        };
                        if (k.equals("crash") && attempt == 0) crashRedelivery = r.deliveryCount();
                        if (fails) {
                            failedAt.put(k, now);
                            KafkaDelay.retry(r).topic(retryTopic).after(after).reason(k + " failed").sendAndAccept(producer, consumer);
                        } else {
                            processed.add(k);
                            consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                        }
                    }
                    consumer.commitSync();
                }
            }
            assertEquals(Optional.of((short) 2), crashRedelivery,
                    "the share group delivered the crashed consumer's record a second time");
            assertEquals(List.of(0, 1, 2), seen.get("flaky"), "flaky: failed twice, back twice, then processed");
            assertEquals(List.of(0, 1, 2), seen.get("doomed"), "doomed: its two retries, then the dead-letter topic");

            // Late duplicates have time to show: the last retry fired at least a crash delay ago.
            Thread.sleep(CRASH_AFTER.toMillis() + 2_000);
            Map<String, Integer> returned = new HashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : readAll(brokers, work)) {
                if (KafkaDelay.attempt(r) > 0) returned.merge(key(r) + "#" + KafkaDelay.attempt(r), 1, Integer::sum);
            }
            assertEquals(Map.of("crash#1", 1, "flaky#1", 1, "flaky#2", 1, "doomed#1", 1, "doomed#2", 1), returned,
                    "each retry back on the topic once; the crashed consumer's two sends made one retry");
            List<ConsumerRecord<byte[], byte[]>> dead = readAll(brokers, dlt);
            assertEquals(1, dead.size(), "one dead letter");
            assertEquals("doomed", key(dead.get(0)));
            assertEquals("retries-exhausted", header(dead.get(0), KafkaDelay.ERROR));
            assertEquals("doomed failed", header(dead.get(0), KafkaDelay.RETRY_REASON));
        } finally {
            broker.destroyForcibly().waitFor();
        }
    }
}
