package dev.kafkadelay;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.MockShareConsumer;
import org.apache.kafka.clients.consumer.ShareConsumer;
import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.header.Header;
import org.junit.jupiter.api.Test;

/** The README's Java helper snippets run as written and are the README's text. */
class ReadmeSnippetTest {
    interface Sender {
        void send(ProducerRecord<byte[], byte[]> r);
    }

    static void snippet(Sender producer, String user, byte[] body, ConsumerRecord<byte[], byte[]> rec) {
        // README java-helper begin
        // a reminder in 30 minutes, replaced by a later one with the same id
        producer.send(KafkaDelay.delayed("delay.emails", "emails", user.getBytes(UTF_8), body)
                .after(Duration.ofMinutes(30)).id("remind-" + user).build());
        // in a consumer of `orders`: this record cannot be processed now, retry it in 30 s
        if (KafkaDelay.attempt(rec) < 5) {
            producer.send(KafkaDelay.retry(rec).after(Duration.ofSeconds(30)).reason("inventory 503").build());
        }
        // README java-helper end
    }

    static void process(ConsumerRecord<byte[], byte[]> rec) throws java.io.IOException {
        throw new java.io.IOException("inventory 503");
    }

    static void shareSnippet(Producer<byte[], byte[]> producer, ShareConsumer<byte[], byte[]> consumer) throws Exception {
        // README java-share begin
        // a share consumer of `orders` with share.acknowledgement.mode=explicit
        for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofSeconds(1))) {
            try {
                process(rec);
                consumer.acknowledge(rec, AcknowledgeType.ACCEPT);
            } catch (java.io.IOException e) { // not now: back on `orders` in 30 s, counted
                KafkaDelay.retry(rec).after(Duration.ofSeconds(30)).reason(e.getMessage()).sendAndAccept(producer, consumer);
            }
        }
        consumer.commitSync();
        // README java-share end
    }

    /** The lines between "// README NAME begin" and "end" in this file, unindented. */
    static String region(String name) throws java.io.IOException {
        String src = Files.readString(Path.of("src/test/java/dev/kafkadelay/ReadmeSnippetTest.java"));
        String region = src.split("// README " + name + " begin\n", 2)[1].split("\n\\s*// README " + name + " end", 2)[0];
        return region.lines().map(l -> l.length() >= 8 ? l.substring(8) : l.strip()).collect(Collectors.joining("\n")) + "\n";
    }

    /** The README's first java block after the text {@code after}. */
    static String readmeBlock(String after) throws java.io.IOException {
        String readme = Files.readString(Path.of("../../README.md"));
        return readme.split(after, 2)[1].split("```java\n", 2)[1].split("```", 2)[0];
    }

    static Contract.Outcome read(ProducerRecord<byte[], byte[]> r, long now) throws Contract.Rejected {
        List<Contract.Header> hs = new ArrayList<>();
        for (Header h : r.headers()) hs.add(new Contract.Header(h.key(), h.value()));
        return Contract.defaults().interpret(new Contract.Incoming(r.topic(), r.key(), r.value(), hs, now), now);
    }

    @Test
    void theReadmeSnippetSchedulesAReminderAndARetryAndIsTheReadmesText() throws Exception {
        List<ProducerRecord<byte[], byte[]>> sent = new ArrayList<>();
        var rec = new ConsumerRecord<>("orders", 0, 7, "order-42".getBytes(UTF_8), "{}".getBytes(UTF_8));
        snippet(sent::add, "u-7", "hi".getBytes(UTF_8), rec);
        long now = 1_763_700_000_000L;
        Contract.Outcome reminder = read(sent.get(0), now), retry = read(sent.get(1), now);
        assertEquals(List.of("schedule", "emails", now + 1_800_000), List.of(reminder.kind(), reminder.target(), reminder.dueMs()));
        assertEquals(List.of("retry", "orders", now + 30_000, 1L), List.of(retry.kind(), retry.target(), retry.dueMs(), retry.attempt()));

        assertEquals(region("java-helper"), readmeBlock("With the helper in \\[`clients/java`\\]"));
    }

    @Test
    void theReadmeShareGroupSnippetSendsANamedRetryAndAcceptsTheRecordAndIsTheReadmesText() throws Exception {
        MockProducer<byte[], byte[]> producer = new MockProducer<>(true, null, new ByteArraySerializer(), new ByteArraySerializer());
        MockShareConsumer<byte[], byte[]> consumer = new MockShareConsumer<>();
        consumer.subscribe(List.of("orders"));
        consumer.addRecord(new ConsumerRecord<>("orders", 0, 7, "order-42".getBytes(UTF_8), "{}".getBytes(UTF_8)));
        shareSnippet(producer, consumer);
        assertEquals(1, producer.history().size());
        ProducerRecord<byte[], byte[]> sent = producer.history().get(0);
        long now = 1_763_700_000_000L;
        Contract.Outcome retry = read(sent, now);
        assertEquals(List.of("retry", "orders", now + 30_000, 1L), List.of(retry.kind(), retry.target(), retry.dueMs(), retry.attempt()));
        assertEquals("share-retry:orders/0/7", new String(sent.headers().lastHeader(KafkaDelay.ID).value(), UTF_8));
        assertEquals(region("java-share"), readmeBlock("\\*\\*A share group's retries in Java\\*\\*"));
    }
}
