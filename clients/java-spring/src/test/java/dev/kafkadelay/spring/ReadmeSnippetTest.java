package dev.kafkadelay.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.util.backoff.FixedBackOff;

/** The README's Spring snippet compiles as written, wires the recoverer, and is the README's text. */
class ReadmeSnippetTest {
    static void configure(ConcurrentKafkaListenerContainerFactory<byte[], byte[]> factory,
            KafkaTemplate<byte[], byte[]> template) {
        // README spring begin
        var recoverer = new KafkaDelayRecoverer(template).retryAfter((rec, ex) -> Duration.ofSeconds(30));
        factory.setCommonErrorHandler(new DefaultErrorHandler(recoverer, new FixedBackOff(0L, 0L)));
        // README spring end
    }

    @Test
    void theReadmeSnippetWiresTheRecovererAndIsTheReadmesText() throws Exception {
        var factory = new ConcurrentKafkaListenerContainerFactory<byte[], byte[]>();
        var template = new KafkaTemplate<byte[], byte[]>(new DefaultKafkaProducerFactory<>(Map.of()));
        factory.setConsumerFactory(new DefaultKafkaConsumerFactory<>(Map.of()));
        configure(factory, template);
        assertInstanceOf(DefaultErrorHandler.class, factory.createContainer("orders").getCommonErrorHandler());

        String src = Files.readString(Path.of("src/test/java/dev/kafkadelay/spring/ReadmeSnippetTest.java"));
        String region = src.split("// README spring begin\n", 2)[1].split("\\s*// README spring end", 2)[0];
        String tested = region.lines().map(String::strip).collect(Collectors.joining("\n")) + "\n";
        String readme = Files.readString(Path.of("../../README.md"));
        String section = readme.split("\\*\\*With Spring Kafka\\*\\*", 2)[1];
        String block = section.split("```java\n", 2)[1].split("```", 2)[0];
        assertEquals(tested, block);
    }
}
