package dev.kafkadelay;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.junit.jupiter.api.Test;

/** The builders make records the broker's contract reads as intended. */
class KafkaDelayTest {
    static final long NOW = 1_763_700_000_000L, SENT = NOW - 1_000;

    static Contract.Outcome read(ProducerRecord<byte[], byte[]> r) throws Contract.Rejected {
        List<Contract.Header> hs = new ArrayList<>();
        for (Header h : r.headers()) hs.add(new Contract.Header(h.key(), h.value()));
        return Contract.defaults().interpret(new Contract.Incoming(r.topic(), r.key(), r.value(), hs, SENT), NOW);
    }

    @Test
    void delayedCancelAndRetryReadAsIntended() throws Exception {
        Contract.Outcome out = read(KafkaDelay.delayed("delay.orders", "orders", "k".getBytes(UTF_8), "v".getBytes(UTF_8))
                .after(Duration.ofSeconds(30)).id("job-1").header("trace-id", "t".getBytes(UTF_8)).build());
        assertEquals("schedule", out.kind());
        assertEquals("orders", out.target());
        assertEquals(SENT + 30_000, out.dueMs());
        assertEquals("job-1", new String(out.id(), UTF_8));
        assertEquals(List.of("trace-id"), out.headers().stream().map(Contract.Header::key).toList());
        assertEquals(NOW + 60_000, read(KafkaDelay.delayed("delay.orders", "orders", null, new byte[0])
                .until(Instant.ofEpochMilli(NOW + 60_000)).build()).dueMs());
        assertEquals("cancel", read(KafkaDelay.cancel("delay.orders", "job-1", "k".getBytes(UTF_8))).kind());
        assertThrows(IllegalStateException.class, () -> KafkaDelay.delayed("delay.o", "o", null, null)
                .after(Duration.ofSeconds(1)).until(Instant.now()));
        assertThrows(IllegalArgumentException.class, () -> KafkaDelay.delayed("delay.o", "o", null, null)
                .header("delay-target", new byte[0]));

        ConsumerRecord<byte[], byte[]> consumed = new ConsumerRecord<>("orders", 0, 7, "k".getBytes(UTF_8), "v".getBytes(UTF_8));
        consumed.headers().add("trace-id", "t".getBytes(UTF_8)).add("delay-origin-offset", "7".getBytes(UTF_8));
        assertEquals(0, KafkaDelay.attempt(consumed));
        Contract.Outcome back = read(KafkaDelay.retry(consumed).after(Duration.ofSeconds(2)).reason("inventory 503").build());
        assertEquals("retry", back.kind());
        assertEquals(1, back.attempt());
        assertEquals(SENT + 2_000, back.dueMs());
        ConsumerRecord<byte[], byte[]> again = new ConsumerRecord<>("orders", 0, 8, "k".getBytes(UTF_8), "v".getBytes(UTF_8));
        back.headers().forEach(h -> again.headers().add(h.key(), h.value()));
        assertEquals(1, KafkaDelay.attempt(again));
        Contract.Outcome done = read(KafkaDelay.retry(again).maxAttempts(1).build());
        assertEquals("exhausted", done.kind());
        assertEquals("orders.dlt", done.deadLetter());
    }
}
