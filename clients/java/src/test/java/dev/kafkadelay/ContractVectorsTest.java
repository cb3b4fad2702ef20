package dev.kafkadelay;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/** The shared contract vectors: the Java contract gives every outcome the broker gives. */
class ContractVectorsTest {
    static final JsonNode VECTORS = read();

    static JsonNode read() {
        try {
            return new ObjectMapper().readTree(Path.of("../../schemas/contract-vectors.json").toFile());
        } catch (java.io.IOException e) {
            throw new RuntimeException(e);
        }
    }

    static byte[] value(JsonNode v) {
        if (v == null || v.isNull()) return null;
        if (v.isTextual()) return v.asText().getBytes(StandardCharsets.UTF_8);
        if (v.has("hex")) return HexFormat.of().parseHex(v.get("hex").asText());
        return v.get("repeat").asText().repeat(v.get("times").asInt()).getBytes(StandardCharsets.UTF_8);
    }

    static List<Contract.Header> headers(JsonNode pairs) {
        List<Contract.Header> out = new ArrayList<>();
        for (JsonNode p : pairs) out.add(new Contract.Header(p.get(0).asText(), value(p.get(1))));
        return out;
    }

    static Contract contract() {
        JsonNode c = VECTORS.get("contract");
        return new Contract(c.get("source_pattern").asText(), c.get("retry_topics").asText(),
                c.get("max_delay_ms").asLong(), c.get("max_record_bytes").asInt(),
                Contract.Policy.parse(c.get("retry_default").asText(), Contract.Policy.defaults()));
    }

    static void hasHeaders(List<Contract.Header> got, JsonNode want) {
        if (want == null) return;
        for (Contract.Header w : headers(want)) {
            List<byte[]> vals = got.stream().filter(h -> h.key().equals(w.key())).map(Contract.Header::value).toList();
            assertEquals(1, vals.size(), "header " + w.key());
            assertArrayEquals(w.value(), vals.get(0), "header " + w.key());
        }
    }

    @TestFactory
    Stream<DynamicTest> everyVector() {
        List<DynamicTest> tests = new ArrayList<>();
        long now = VECTORS.get("now_ms").asLong();
        for (JsonNode c : VECTORS.get("cases")) {
            tests.add(DynamicTest.dynamicTest(c.get("name").asText(), () -> {
                Contract.Incoming rec = new Contract.Incoming(c.get("topic").asText(), value(c.get("key")),
                        value(c.get("value")), headers(c.get("headers")), c.get("timestamp_ms").asLong());
                String kind = c.get("expect").fieldNames().next();
                JsonNode want = c.get("expect").get(kind);
                if (kind.equals("reject")) {
                    Contract.Rejected r = assertThrows(Contract.Rejected.class, () -> contract().interpret(rec, now));
                    assertEquals(want.asText(), r.code());
                    assertNotNull(r.getMessage());
                    return;
                }
                Contract.Outcome got = contract().interpret(rec, now);
                assertEquals(kind, got.kind());
                if (kind.equals("cancel")) {
                    assertArrayEquals(value(want.get("id")), got.id());
                    return;
                }
                assertEquals(want.get("target").asText(), got.target());
                assertEquals(want.get("due_ms").asLong(), got.dueMs());
                switch (kind) {
                    case "schedule" -> {
                        assertArrayEquals(value(want.get("id")), got.id());
                        if (want.has("key")) assertArrayEquals(value(want.get("key")), got.key());
                        if (want.has("value")) assertArrayEquals(value(want.get("value")), got.value());
                        if (want.has("headers")) {
                            List<Contract.Header> w = headers(want.get("headers"));
                            assertEquals(w.size(), got.headers().size());
                            for (int i = 0; i < w.size(); i++) {
                                assertEquals(w.get(i).key(), got.headers().get(i).key());
                                assertArrayEquals(w.get(i).value(), got.headers().get(i).value());
                            }
                        }
                    }
                    case "retry" -> {
                        assertEquals(want.get("attempt").asLong(), got.attempt());
                        hasHeaders(got.headers(), want.get("headers"));
                    }
                    default -> {
                        assertEquals(want.get("dead_letter").asText(), got.deadLetter());
                        hasHeaders(got.headers(), want.get("headers"));
                    }
                }
            }));
        }
        assertTrue(tests.size() >= 50, "the vectors are there");
        return tests.stream();
    }
}
