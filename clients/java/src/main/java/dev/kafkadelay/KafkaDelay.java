package dev.kafkadelay;

import static java.nio.charset.StandardCharsets.UTF_8;

import java.time.Duration;
import java.time.Instant;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ShareConsumer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.utils.Utils;

/**
 * Records for kafka-delay with kafka-clients: {@link #delayed} and {@link #cancel} for delay
 * topics, {@link #retry} and {@link #attempt} for consumers that retry through kafka-delay
 * (consumer groups and share groups), and the header names of the contract.
 */
public final class KafkaDelay {
    public static final String TARGET = "delay-target";
    public static final String UNTIL = "delay-until";
    public static final String AFTER = "delay-after";
    public static final String ID = "delay-id";
    public static final String SCHEDULER_EPOCH = "scheduler-epoch";
    public static final String SCHEDULER_TARGET_TOPIC = "scheduler-target-topic";
    public static final String SCHEDULER_TARGET_KEY = "scheduler-target-key";
    public static final String ERROR = "delay-error";
    public static final String ERROR_DETAIL = "delay-error-detail";
    public static final String DUE_MS = "delay-due-ms";
    public static final String FIRED_MS = "delay-fired-ms";
    public static final String RETRY_AFTER = "retry-after";
    public static final String RETRY_ATTEMPT = "retry-attempt";
    public static final String RETRY_FIRST_FAILED_AT = "retry-first-failed-at";
    public static final String RETRY_MAX_ATTEMPTS = "retry-max-attempts";
    public static final String RETRY_REASON = "retry-reason";
    /** The broker's default retry topic. */
    public static final String RETRY_TOPIC = "delay.retry";

    private KafkaDelay() {}

    /** A record for delay topic {@code topic}, published to {@code target} when due. */
    public static Delayed delayed(String topic, String target, byte[] key, byte[] value) {
        return new Delayed(topic, target, key, value);
    }

    /** Drops the pending record named {@code id}; send it with the key of the record it cancels. */
    public static ProducerRecord<byte[], byte[]> cancel(String topic, String id, byte[] key) {
        ProducerRecord<byte[], byte[]> r = new ProducerRecord<>(topic, key, null);
        r.headers().add(ID, id.getBytes(UTF_8));
        return r;
    }

    /** The retry count of a consumed record: 0 on a first delivery, n on the n-th retry. */
    public static int attempt(ConsumerRecord<?, ?> rec) {
        Header h = rec.headers().lastHeader(RETRY_ATTEMPT);
        return h == null || h.value() == null ? 0 : Integer.parseInt(new String(h.value(), UTF_8));
    }

    /** The consumed record sent back through kafka-delay's retry topic, to return to its topic. */
    public static Retry retry(ConsumerRecord<byte[], byte[]> rec) {
        return new Retry(rec);
    }

    /**
     * The {@code delay-id} of a share group's retry: the delivered record's topic, partition and
     * offset, the same however often the share group delivers it.
     */
    public static String shareRetryId(ConsumerRecord<?, ?> rec) {
        return "share-retry:" + rec.topic() + "/" + rec.partition() + "/" + rec.offset();
    }

    /** Builds a delayed record: give {@link #after} or {@link #until} (or neither on a fixed-delay topic). */
    public static final class Delayed {
        private final ProducerRecord<byte[], byte[]> record;
        private boolean due;

        private Delayed(String topic, String target, byte[] key, byte[] value) {
            record = new ProducerRecord<>(topic, key, value);
            record.headers().add(TARGET, target.getBytes(UTF_8));
        }

        /** Due this long after the record's timestamp. */
        public Delayed after(Duration d) {
            if (d.isNegative()) throw new IllegalArgumentException("a delay cannot be negative: " + d);
            return due(AFTER, Long.toString(d.toMillis()));
        }

        /** Due at this time. */
        public Delayed until(Instant t) {
            return due(UNTIL, Long.toString(t.toEpochMilli()));
        }

        private Delayed due(String header, String value) {
            if (due) throw new IllegalStateException("give after or until, not both");
            due = true;
            record.headers().add(header, value.getBytes(UTF_8));
            return this;
        }

        /** Names the pending record: a later one with the same id replaces it, a cancel drops it. */
        public Delayed id(String id) {
            record.headers().add(ID, id.getBytes(UTF_8));
            return this;
        }

        /** An application header, published with the record. */
        public Delayed header(String key, byte[] value) {
            if (key.startsWith("delay-") || key.startsWith("scheduler-")) {
                throw new IllegalArgumentException("header " + key + " belongs to kafka-delay");
            }
            record.headers().add(key, value);
            return this;
        }

        public ProducerRecord<byte[], byte[]> build() {
            return record;
        }
    }

    /** Builds a retry of a consumed record (its key, value and headers, less the broker's). */
    public static final class Retry {
        private final ConsumerRecord<byte[], byte[]> rec;
        private String topic = RETRY_TOPIC;
        private Duration after;
        private String reason;
        private Integer maxAttempts;

        private Retry(ConsumerRecord<byte[], byte[]> rec) {
            this.rec = rec;
        }

        /** The retry topic, if not the broker's default {@value #RETRY_TOPIC}. */
        public Retry topic(String topic) {
            this.topic = topic;
            return this;
        }

        /** Back after this long (otherwise the target's backoff policy decides). */
        public Retry after(Duration d) {
            this.after = d;
            return this;
        }

        /** Why it failed: carried back and onto the dead letter. */
        public Retry reason(String reason) {
            this.reason = reason;
            return this;
        }

        /** Lowers the target's maximum number of retries for this record. */
        public Retry maxAttempts(int n) {
            this.maxAttempts = n;
            return this;
        }

        /**
         * For a share group (KIP-932): sends the retry, waits until the Kafka cluster has it, then
         * accepts the record ({@code share.acknowledgement.mode=explicit}; the acknowledgement goes
         * to the broker with the consumer's next poll or commit). The retry is named after this
         * delivery ({@code delay-id}, see {@link #shareRetryId}), so when the consumer dies between
         * the send and the acknowledgement and the share group delivers the record again, the
         * retry sent then replaces the first while that one is still pending: one retry, not two.
         * A retry-after shorter than the group's record lock ({@code share.record.lock.duration.ms},
         * 30 s by default) can let the first one fire before a crashed consumer's record comes
         * back; the second is then a second retry (at least once).
         */
        public void sendAndAccept(Producer<byte[], byte[]> producer, ShareConsumer<byte[], byte[]> consumer)
                throws InterruptedException, ExecutionException {
            producer.send(forShareGroup(producer)).get();
            consumer.acknowledge(rec, AcknowledgeType.ACCEPT);
        }

        /**
         * The retry {@link #sendAndAccept} sends: {@link #build()} with the {@code delay-id} of
         * this delivery, on the retry topic's partition the id picks when the record has no key
         * (a keyed record goes where its key does, so a second retry meets the first).
         */
        public ProducerRecord<byte[], byte[]> forShareGroup(Producer<byte[], byte[]> producer) {
            ProducerRecord<byte[], byte[]> r = build();
            String id = shareRetryId(rec);
            r.headers().add(ID, id.getBytes(UTF_8));
            if (rec.key() != null) return r;
            int partitions = producer.partitionsFor(topic).size();
            int partition = Utils.toPositive(Utils.murmur2(id.getBytes(UTF_8))) % partitions;
            return new ProducerRecord<>(topic, partition, r.timestamp(), r.key(), r.value(), r.headers());
        }

        public ProducerRecord<byte[], byte[]> build() {
            ProducerRecord<byte[], byte[]> r = new ProducerRecord<>(topic, rec.key(), rec.value());
            for (Header h : rec.headers()) {
                boolean replaced = h.key().equals(RETRY_AFTER)
                        || (reason != null && h.key().equals(RETRY_REASON))
                        || (maxAttempts != null && h.key().equals(RETRY_MAX_ATTEMPTS));
                if (!h.key().startsWith("delay-") && !replaced) r.headers().add(h);
            }
            r.headers().add(TARGET, rec.topic().getBytes(UTF_8));
            if (after != null) r.headers().add(RETRY_AFTER, (after.toMillis() + "ms").getBytes(UTF_8));
            if (reason != null) r.headers().add(RETRY_REASON, reason.getBytes(UTF_8));
            if (maxAttempts != null) r.headers().add(RETRY_MAX_ATTEMPTS, maxAttempts.toString().getBytes(UTF_8));
            return r;
        }
    }
}
