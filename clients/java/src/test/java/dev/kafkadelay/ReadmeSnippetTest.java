package dev.kafkadelay;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.junit.jupiter.api.Test;

/** The README's Java helper snippet runs as written and is the README's text. */
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

        String src = Files.readString(Path.of("src/test/java/dev/kafkadelay/ReadmeSnippetTest.java"));
        String region = src.split("// README java-helper begin\n", 2)[1].split("\n\\s*// README java-helper end", 2)[0];
        String tested = region.lines().map(l -> l.length() >= 8 ? l.substring(8) : l.strip()).collect(Collectors.joining("\n")) + "\n";
        String readme = Files.readString(Path.of("../../README.md"));
        String block = readme.split("With the helper in \\[`clients/java`\\]", 2)[1].split("```java\n", 2)[1].split("```", 2)[0];
        assertEquals(tested, block);
    }
}
