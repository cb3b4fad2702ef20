package dev.kafkadelay.spring;

import dev.kafkadelay.KafkaDelay;
import java.time.Duration;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.BiFunction;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.springframework.kafka.core.KafkaOperations;
import org.springframework.kafka.listener.ConsumerRecordRecoverer;

/**
 * Sends a record its listener failed on to kafka-delay's retry topic, for Spring Kafka's {@code
 * DefaultErrorHandler}: kafka-delay publishes it back to the listener's topic after the
 * retry-after this recoverer computes (or the target's backoff policy when it gives none), with
 * {@code retry-attempt} counting the passes, and to {@code <target>.dlt} once they are used up.
 * The listener's partition goes on meanwhile: retries without blocking and without retry topics
 * per delay.
 *
 * <pre>{@code
 * var recoverer = new KafkaDelayRecoverer(template)
 *         .retryAfter((rec, ex) -> Duration.ofSeconds(30));
 * factory.setCommonErrorHandler(new DefaultErrorHandler(recoverer, new FixedBackOff(0L, 0L)));
 * }</pre>
 *
 * Records must be {@code byte[]} keys and values (the recoverer re-sends them unchanged).
 */
public final class KafkaDelayRecoverer implements ConsumerRecordRecoverer {
    private final KafkaOperations<byte[], byte[]> template;
    private String retryTopic = KafkaDelay.RETRY_TOPIC;
    private BiFunction<ConsumerRecord<?, ?>, Exception, Duration> retryAfter = (r, e) -> null;
    private Integer maxAttempts;

    public KafkaDelayRecoverer(KafkaOperations<byte[], byte[]> template) {
        this.template = template;
    }

    /** The broker's retry topic, if not {@value KafkaDelay#RETRY_TOPIC}. */
    public KafkaDelayRecoverer retryTopic(String topic) {
        this.retryTopic = topic;
        return this;
    }

    /** When the record comes back, from the record and the failure; null for the policy's backoff. */
    public KafkaDelayRecoverer retryAfter(BiFunction<ConsumerRecord<?, ?>, Exception, Duration> f) {
        this.retryAfter = f;
        return this;
    }

    /** Lowers the target's maximum number of retries for these records. */
    public KafkaDelayRecoverer maxAttempts(int n) {
        this.maxAttempts = n;
        return this;
    }

    @Override
    @SuppressWarnings("unchecked")
    public void accept(ConsumerRecord<?, ?> record, Exception exception) {
        Throwable cause = exception.getCause() != null ? exception.getCause() : exception;
        KafkaDelay.Retry retry = KafkaDelay.retry((ConsumerRecord<byte[], byte[]>) record)
                .topic(retryTopic)
                .reason(String.valueOf(cause.getMessage()));
        Duration after = retryAfter.apply(record, exception);
        if (after != null) retry.after(after);
        if (maxAttempts != null) retry.maxAttempts(maxAttempts);
        try {
            // Acknowledged before the offset is committed: the record is never lost.
            template.send(retry.build()).get(30, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted sending a retry to " + retryTopic, e);
        } catch (ExecutionException | TimeoutException e) {
            throw new IllegalStateException("could not send a retry to " + retryTopic, e);
        }
    }
}
