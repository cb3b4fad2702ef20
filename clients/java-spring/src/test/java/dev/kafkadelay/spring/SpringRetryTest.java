package dev.kafkadelay.spring;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kafkadelay.KafkaDelay;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.listener.KafkaMessageListenerContainer;
import org.springframework.kafka.listener.MessageListener;
import org.springframework.util.backoff.FixedBackOff;

/**
 * A Spring Kafka listener with kafka-delay in between (Apache Kafka and the broker binary: mvn
 * test -Dgroups=e2e with KAFKA_DELAY_TEST_BROKERS and KAFKA_DELAY_BIN; scripts/test-external.sh
 * sets both).
 */
@Tag("e2e")
class SpringRetryTest {
    /** The broker's data dir, removed by JUnit after the test. */
    @TempDir
    Path dataDir;

    static final String BROKERS = System.getenv("KAFKA_DELAY_TEST_BROKERS");
    static final String BIN = System.getenv("KAFKA_DELAY_BIN");
    static final Duration RETRY_AFTER = Duration.ofSeconds(2);

    /** One delivery the listener saw: its attempt, when it failed (or 0), and its due time. */
    record Seen(int attempt, long failedAt, Long dueMs, long receivedAt) {}

    static String header(ConsumerRecord<?, ?> r, String name) {
        Header h = r.headers().lastHeader(name);
        return h == null ? null : new String(h.value(), UTF_8);
    }

    /**
     * kafka-delay for this run's topics (created here): the listener's orders-RUN, the retry topic
     * delay.RUN.retry and the broker's dead-letter topic dlt-RUN.
     */
    Process startBroker(String run) throws Exception {
        assertNotNull(BROKERS, "set KAFKA_DELAY_TEST_BROKERS (scripts/test-external.sh does)");
        assertNotNull(BIN, "set KAFKA_DELAY_BIN (scripts/test-external.sh does)");
        createTopics("delay." + run + ".retry", "orders-" + run, "dlt-" + run);
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        Process p = new ProcessBuilder(BIN, "run", "--brokers", BROKERS,
                "--data-dir", dataDir.toString(), "--http-addr", "127.0.0.1:" + port,
                "--group-id", "g-" + run, "--instance-id", "i-" + run, "--source-pattern", "^delay\\." + run + "\\..+",
                "--retry-topics", "^delay\\." + run + "\\.retry$", "--dead-letter-topic", "dlt-" + run,
                "--topic-refresh", "500ms").redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        HttpClient http = HttpClient.newHttpClient();
        long readyBy = System.currentTimeMillis() + 60_000;
        while (true) {
            assertTrue(p.isAlive(), "kafka-delay exited");
            try {
                if (http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/readyz")).build(),
                        HttpResponse.BodyHandlers.discarding()).statusCode() == 200) return p;
            } catch (java.io.IOException e) {
                // not listening yet
            }
            assertTrue(System.currentTimeMillis() < readyBy, "kafka-delay not ready within 60 s");
            Thread.sleep(100);
        }
    }

    /** Runs a listener on `target` that fails while fails(attempt); returns what it saw. */
    static List<Seen> listen(String run, String target, int maxAttempts, java.util.function.IntPredicate fails,
            CountDownLatch done) throws Exception {
        List<Seen> seen = Collections.synchronizedList(new ArrayList<>());
        Map<String, Object> pc = Map.of("bootstrap.servers", BROKERS, "key.serializer", ByteArraySerializer.class,
                "value.serializer", ByteArraySerializer.class);
        KafkaTemplate<byte[], byte[]> template = new KafkaTemplate<>(new DefaultKafkaProducerFactory<>(pc));
        Map<String, Object> cc = Map.of("bootstrap.servers", BROKERS, "group.id", "app-" + run,
                "key.deserializer", ByteArrayDeserializer.class, "value.deserializer", ByteArrayDeserializer.class,
                "auto.offset.reset", "earliest");
        ContainerProperties props = new ContainerProperties(target);
        props.setMessageListener((MessageListener<byte[], byte[]>) rec -> {
            int attempt = KafkaDelay.attempt(rec);
            String due = header(rec, KafkaDelay.DUE_MS);
            long now = System.currentTimeMillis();
            if (fails.test(attempt)) {
                seen.add(new Seen(attempt, now, due == null ? null : Long.parseLong(due), now));
                done.countDown();
                throw new IllegalStateException("inventory 503 on attempt " + attempt);
            }
            seen.add(new Seen(attempt, 0, due == null ? null : Long.parseLong(due), now));
            done.countDown();
        });
        KafkaDelayRecoverer recoverer = new KafkaDelayRecoverer(template)
                .retryTopic("delay." + run + ".retry")
                .retryAfter((r, e) -> RETRY_AFTER);
        if (maxAttempts > 0) recoverer.maxAttempts(maxAttempts);
        KafkaMessageListenerContainer<byte[], byte[]> container = new KafkaMessageListenerContainer<>(
                new DefaultKafkaConsumerFactory<>(cc), props);
        container.setCommonErrorHandler(new DefaultErrorHandler(recoverer, new FixedBackOff(0L, 0L)));
        container.start();
        template.send(new ProducerRecord<>(target, "order-42".getBytes(UTF_8), "{\"id\":42}".getBytes(UTF_8))).get();
        try {
            assertTrue(done.await(60, TimeUnit.SECONDS), "the listener saw every delivery within 60 s: " + seen);
        } finally {
            container.stop();
            template.destroy();
        }
        return seen;
    }

    static void createTopics(String... names) throws Exception {
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", BROKERS))) {
            List<NewTopic> ts = new ArrayList<>();
            for (String n : names) ts.add(new NewTopic(n, 1, (short) 1));
            admin.createTopics(ts).all().get();
        }
    }

    @Test
    void failingTwiceThenSucceedingGetsNonBlockingRetriesAndNothingIsDeadLettered() throws Exception {
        String run = "spring_" + (System.nanoTime() % 1_000_000_000L), target = "orders-" + run;
        Process broker = startBroker(run);
        try {
            List<Seen> seen = listen(run, target, 0, attempt -> attempt < 2, new CountDownLatch(3));
            assertEquals(List.of(0, 1, 2), seen.stream().map(Seen::attempt).toList(), seen.toString());
            for (int i = 1; i <= 2; i++) {
                Seen before = seen.get(i - 1), now = seen.get(i);
                assertTrue(now.dueMs() >= before.failedAt() + RETRY_AFTER.toMillis(),
                        "attempt " + i + " due no earlier than its retry-after: " + seen);
                assertTrue(now.receivedAt() >= now.dueMs(), "attempt " + i + " never early: " + seen);
            }
            assertEquals(0, seen.get(2).failedAt(), "the third delivery was processed");
            Thread.sleep(2_000);
            try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(Map.of("bootstrap.servers", BROKERS,
                    "key.deserializer", ByteArrayDeserializer.class, "value.deserializer", ByteArrayDeserializer.class))) {
                boolean exists = c.listTopics().containsKey(target + ".dlt");
                long records = 0;
                if (exists) {
                    TopicPartition tp = new TopicPartition(target + ".dlt", 0);
                    records = c.endOffsets(List.of(tp)).get(tp);
                }
                assertEquals(0, records, "nothing lands in the dead-letter topic");
            }
        } finally {
            broker.destroyForcibly().waitFor();
        }
    }

    @Test
    void withTheMaximumLoweredTheRecordLandsInTheTargetsDeadLetterTopic() throws Exception {
        String run = "springdlt_" + (System.nanoTime() % 1_000_000_000L), target = "orders-" + run;
        Process broker = startBroker(run);
        try {
            List<Seen> seen = listen(run, target, 1, attempt -> true, new CountDownLatch(2));
            assertEquals(List.of(0, 1), seen.stream().map(Seen::attempt).toList(), seen.toString());
            try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(Map.of("bootstrap.servers", BROKERS,
                    "key.deserializer", ByteArrayDeserializer.class, "value.deserializer", ByteArrayDeserializer.class,
                    "group.id", "dlt-reader-" + run, "auto.offset.reset", "earliest"))) {
                c.subscribe(List.of(target + ".dlt"));
                ConsumerRecord<byte[], byte[]> dead = null;
                long deadline = System.currentTimeMillis() + 60_000;
                while (dead == null && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) dead = r;
                }
                assertNotNull(dead, "the record reached " + target + ".dlt");
                assertEquals("order-42", new String(dead.key(), UTF_8));
                assertEquals("retries-exhausted", header(dead, KafkaDelay.ERROR));
                assertEquals(target, header(dead, KafkaDelay.TARGET));
                assertEquals("1", header(dead, KafkaDelay.RETRY_ATTEMPT));
                assertEquals("inventory 503 on attempt 1", header(dead, KafkaDelay.RETRY_REASON));
                assertNotNull(header(dead, KafkaDelay.RETRY_FIRST_FAILED_AT));
                assertNotNull(header(dead, KafkaDelay.ERROR_DETAIL));
            }
        } finally {
            broker.destroyForcibly().waitFor();
        }
    }
}
