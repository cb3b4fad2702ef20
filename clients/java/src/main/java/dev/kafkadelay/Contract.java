package dev.kafkadelay;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.time.OffsetDateTime;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeParseException;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;

/**
 * kafka-delay's header contract, as the broker applies it to a consumed record: {@link
 * #interpret} says whether the broker schedules it, counts it as a retry, dead-letters an
 * exhausted retry, cancels a pending record, or rejects it with a {@code delay-error} code. Tested
 * on the shared vectors in {@code schemas/contract-vectors.json}, which the broker's own contract
 * tests read as well.
 */
public final class Contract {
    static final long MAX_ATTEMPTS_LIMIT = 1_000_000;
    static final long MIN_PLAUSIBLE_EPOCH_MS = 100_000_000_000L;
    private static final Pattern LEGAL_TOPIC = Pattern.compile("[A-Za-z0-9._-]+");
    private static final Pattern RFC3339 =
            Pattern.compile("\\d{4}-\\d{2}-\\d{2}[Tt ]\\d{2}:\\d{2}:\\d{2}(\\.\\d+)?([Zz]|[+-]\\d{2}:\\d{2})");
    private static final String[] UNIT_NAMES = {"d", "h", "m", "s", "ms"};
    private static final long[] UNIT_MS = {86_400_000L, 3_600_000L, 60_000L, 1_000L, 1L};

    /** A header: a key and a value, null for a header without one. */
    public record Header(String key, byte[] value) {}

    /** A consumed record, as the broker sees it; timestampMs null when it has none. */
    public record Incoming(String topic, byte[] key, byte[] value, List<Header> headers, Long timestampMs) {}

    /** What the broker does: kind is schedule, retry, exhausted or cancel. */
    public record Outcome(String kind, String target, long dueMs, byte[] id, byte[] key, byte[] value,
            List<Header> headers, long attempt, String deadLetter) {}

    /** A record the broker dead-letters at ingest; {@link #code()} is its delay-error. */
    public static final class Rejected extends Exception {
        private final String code;

        Rejected(String code, String detail) {
            super(detail);
            this.code = code;
        }

        public String code() {
            return code;
        }
    }

    /** A retry backoff policy (the broker's --retry-default / --retry-policy keys). */
    public record Policy(String backoff, long delayMs, double factor, long maxDelayMs, double jitter,
            long maxAttempts, String deadLetter) {
        public static Policy defaults() {
            return new Policy("exponential", 1_000, 2, 300_000, 0.1, 5, "{target}.dlt");
        }

        public static Policy parse(String spec, Policy base) {
            String backoff = base.backoff, deadLetter = base.deadLetter;
            long delay = base.delayMs, maxDelay = base.maxDelayMs, maxAttempts = base.maxAttempts;
            double factor = base.factor, jitter = base.jitter;
            for (String part : spec.split(",")) {
                part = part.trim();
                if (part.isEmpty()) continue;
                String[] kv = part.split("=", 2);
                String v = kv.length > 1 ? kv[1] : "";
                switch (kv[0]) {
                    case "backoff" -> backoff = v;
                    case "delay" -> delay = parseDurationMs(v);
                    case "factor" -> factor = Double.parseDouble(v);
                    case "max-delay" -> maxDelay = parseDurationMs(v);
                    case "jitter" -> jitter = Double.parseDouble(v);
                    case "max-attempts" -> maxAttempts = Long.parseLong(v);
                    case "dead-letter" -> deadLetter = v;
                    default -> throw new IllegalArgumentException("unknown key '" + kv[0] + "'");
                }
            }
            return new Policy(backoff, delay, factor, maxDelay, jitter, maxAttempts, deadLetter);
        }

        /** The wait before retry attempt (1-based), u uniform in [0, 1) for the jitter. */
        public long delayFor(long attempt, double u) {
            long n = Math.min(Math.max(attempt, 1) - 1, 1_000);
            double raw = backoff.equals("fixed")
                    ? delayMs
                    : Math.min(delayMs * Math.pow(factor, n), (double) maxDelayMs);
            double j = raw * (1 + jitter * (2 * Math.min(Math.max(u, 0), 1) - 1));
            if (!backoff.equals("fixed")) j = Math.min(j, maxDelayMs);
            return Math.max(Math.round(j), 0);
        }

        public String deadLetterTopic(String target) {
            return deadLetter.replace("{target}", target);
        }
    }

    private final Pattern sourcePattern;
    private final Pattern retryTopics;
    private final long maxDelayMs;
    private final int maxRecordBytes;
    private final Policy retryDefault;

    public Contract(String sourcePattern, String retryTopics, long maxDelayMs, int maxRecordBytes, Policy retryDefault) {
        this.sourcePattern = Pattern.compile(sourcePattern);
        this.retryTopics = Pattern.compile(retryTopics);
        this.maxDelayMs = maxDelayMs;
        this.maxRecordBytes = maxRecordBytes;
        this.retryDefault = retryDefault;
    }

    /** The broker's defaults. */
    public static Contract defaults() {
        return new Contract("^delay\\..+", "^delay\\.retry$", 365L * 86_400_000L, 1 << 20, Policy.defaults());
    }

    /** What the broker does with rec at wall-clock time nowMs. */
    public Outcome interpret(Incoming rec, long nowMs) throws Rejected {
        long size = len(rec.key()) + len(rec.value());
        for (Header h : rec.headers()) size += h.key().getBytes(StandardCharsets.UTF_8).length + len(h.value());
        if (size > maxRecordBytes) throw new Rejected("oversized", "record is " + size + " bytes");
        String target = control(rec.headers(), KafkaDelay.TARGET);
        String compatTarget = control(rec.headers(), KafkaDelay.SCHEDULER_TARGET_TOPIC);
        String id = control(rec.headers(), KafkaDelay.ID);
        boolean compat = target == null && (compatTarget != null
                || control(rec.headers(), KafkaDelay.SCHEDULER_EPOCH) != null
                || (rec.value() == null && id == null && rec.key() != null));
        if (compat) return interpretCompat(rec, compatTarget, nowMs);
        byte[] idb = id == null ? null : id.getBytes(StandardCharsets.UTF_8);
        if (rec.value() == null && idb != null) return new Outcome("cancel", null, 0, idb, null, null, List.of(), 0, null);
        if (target == null) throw new Rejected("missing-target", "no delay-target header");
        checkTarget(target);
        if (retryTopics.matcher(rec.topic()).find() || control(rec.headers(), KafkaDelay.RETRY_AFTER) != null) {
            return interpretRetry(rec, target, idb, nowMs);
        }
        return new Outcome("schedule", target, dueTime(rec, nowMs), idb, rec.key(), rec.value(),
                userHeaders(rec.headers()), 0, null);
    }

    /** Checks a target topic name against Kafka's rules and the broker's policy. */
    public void checkTarget(String t) throws Rejected {
        if (t.isEmpty()) throw new Rejected("invalid-target", "target topic is empty");
        if (t.length() > 249) throw new Rejected("invalid-target", "target topic is longer than 249 characters");
        if (t.equals(".") || t.equals("..")) throw new Rejected("invalid-target", "'" + t + "' is not a legal topic name");
        if (!LEGAL_TOPIC.matcher(t).matches()) throw new Rejected("invalid-target", "'" + t + "' has characters Kafka does not allow");
        if (t.startsWith("__")) throw new Rejected("target-internal", "'" + t + "' is internal");
        if (sourcePattern.matcher(t).find()) throw new Rejected("target-loop", "'" + t + "' matches the source pattern and would loop");
    }

    private static long len(byte[] b) {
        return b == null ? 0 : b.length;
    }

    static String control(List<Header> headers, String name) throws Rejected {
        String found = null;
        for (Header h : headers) {
            if (!h.key().equals(name)) continue;
            if (h.value() == null) throw new Rejected("invalid-header", "header " + name + " has no value");
            String text;
            try {
                text = StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(h.value())).toString();
            } catch (CharacterCodingException e) {
                throw new Rejected("invalid-header", "header " + name + " is not UTF-8");
            }
            if (found != null && !found.equals(text)) {
                throw new Rejected("conflicting-headers", "header " + name + " appears with different values");
            }
            found = text;
        }
        return found;
    }

    private static List<Header> userHeaders(List<Header> headers) {
        List<Header> out = new ArrayList<>();
        for (Header h : headers) {
            if (!h.key().startsWith("delay-") && !h.key().startsWith("scheduler-")) out.add(h);
        }
        return out;
    }

    private static boolean digits(String s) {
        return s.chars().allMatch(c -> c >= '0' && c <= '9');
    }

    /** 250ms, 30s, 5m, 2h, 1d, 1h30m: whole numbers, units largest first. */
    public static long parseDurationMs(String text) {
        if (text.isEmpty()) throw new IllegalArgumentException("empty duration");
        long total = 0;
        int last = -1, i = 0;
        while (i < text.length()) {
            int start = i;
            while (i < text.length() && text.charAt(i) >= '0' && text.charAt(i) <= '9') i++;
            if (start == i) throw new IllegalArgumentException("'" + text + "' is not a duration (like 30s, 5m, 250ms)");
            long number;
            try {
                number = Long.parseLong(text.substring(start, i));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("'" + text + "' is out of range");
            }
            int us = i;
            while (i < text.length() && Character.isLetter(text.charAt(i)) && text.charAt(i) < 128) i++;
            String unit = text.substring(us, i);
            int rank = -1;
            for (int r = 0; r < UNIT_NAMES.length; r++) if (UNIT_NAMES[r].equals(unit)) rank = r;
            if (rank < 0) throw new IllegalArgumentException("'" + text + "' needs a unit: d, h, m, s or ms");
            if (rank <= last) throw new IllegalArgumentException("'" + text + "' repeats a unit or puts a smaller one first");
            last = rank;
            try {
                total = Math.addExact(total, Math.multiplyExact(number, UNIT_MS[rank]));
            } catch (ArithmeticException e) {
                throw new IllegalArgumentException("'" + text + "' is out of range");
            }
        }
        return total;
    }

    private static long parseInteger(String text, String what) {
        if (text.isEmpty()) throw new IllegalArgumentException("empty " + what);
        if (text.length() > 1 && text.charAt(0) == '-' && digits(text.substring(1))) {
            throw new IllegalArgumentException(what + " '" + text + "' is negative");
        }
        if (!digits(text)) throw new IllegalArgumentException(what + " '" + text + "' is not a whole number of digits");
        try {
            return Long.parseLong(text);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(what + " '" + text + "' is out of range");
        }
    }

    private static long parseEpochMsOrRfc3339(String text) {
        if (digits(text) || (text.startsWith("-") && !text.contains("T"))) {
            long ms = parseInteger(text, "epoch milliseconds");
            if (ms < MIN_PLAUSIBLE_EPOCH_MS) throw new IllegalArgumentException("'" + text + "' looks like epoch seconds");
            return ms;
        }
        if (!RFC3339.matcher(text).matches()) throw new IllegalArgumentException("'" + text + "' is neither epoch ms nor RFC 3339");
        try {
            long ms = OffsetDateTime.parse(text.replace('t', 'T').replace('z', 'Z').replace(' ', 'T')).toInstant().toEpochMilli();
            if (ms < 0) throw new IllegalArgumentException("'" + text + "' is before the Unix epoch");
            return ms;
        } catch (DateTimeParseException e) {
            throw new IllegalArgumentException("'" + text + "' is not RFC 3339");
        }
    }

    private static long parseRetryAfter(String text, long baseMs) {
        String d = text.startsWith("-") ? text.substring(1) : text;
        if (!d.isEmpty() && digits(d)) return baseMs + parseInteger(text, "seconds") * 1_000;
        if (text.contains(",") || text.endsWith("GMT")) {
            try {
                return ZonedDateTime.parse(text, DateTimeFormatter.RFC_1123_DATE_TIME).toInstant().toEpochMilli();
            } catch (DateTimeParseException e) {
                throw new IllegalArgumentException("'" + text + "' is not an HTTP-date");
            }
        }
        return baseMs + parseDurationMs(text);
    }

    private long withinMaxDelay(long due, long nowMs) throws Rejected {
        if (Long.compareUnsigned(due, nowMs + maxDelayMs) > 0) {
            throw new Rejected("due-too-far", "due time " + due + " is over the maximum delay");
        }
        return due;
    }

    private long dueTime(Incoming rec, long nowMs) throws Rejected {
        String until = control(rec.headers(), KafkaDelay.UNTIL);
        String after = control(rec.headers(), KafkaDelay.AFTER);
        String epoch = control(rec.headers(), KafkaDelay.SCHEDULER_EPOCH);
        int given = (until != null ? 1 : 0) + (after != null ? 1 : 0) + (epoch != null ? 1 : 0);
        if (given > 1) throw new Rejected("conflicting-due-time", "more than one of delay-until, delay-after, scheduler-epoch");
        long base = rec.timestampMs() != null ? rec.timestampMs() : nowMs;
        long due;
        try {
            if (until != null) {
                due = parseEpochMsOrRfc3339(until);
            } else if (after != null) {
                String d = after.startsWith("-") ? after.substring(1) : after;
                long ms = !d.isEmpty() && digits(d) ? parseInteger(after, "milliseconds") : parseDurationMs(after);
                due = base + ms;
                if (due < base) throw new Rejected("due-too-far", "delay-after '" + after + "' is beyond any time");
            } else if (epoch != null) {
                due = Math.multiplyExact(parseInteger(epoch, "epoch seconds"), 1_000L);
            } else {
                int dot = rec.topic().lastIndexOf('.');
                long fixed;
                try {
                    if (dot < 0) throw new IllegalArgumentException();
                    fixed = parseDurationMs(rec.topic().substring(dot + 1));
                } catch (IllegalArgumentException e) {
                    throw new Rejected("missing-due-time", "no delay-until or delay-after header");
                }
                due = base + fixed;
            }
        } catch (IllegalArgumentException | ArithmeticException e) {
            throw new Rejected("invalid-due-time", String.valueOf(e.getMessage()));
        }
        return withinMaxDelay(due, nowMs);
    }

    private Outcome interpretCompat(Incoming rec, String target, long nowMs) throws Rejected {
        if (rec.key() == null || rec.key().length == 0) {
            throw new Rejected("missing-id", "scheduler-* record without a key: the key is the schedule id");
        }
        if (rec.value() == null) return new Outcome("cancel", null, 0, rec.key(), null, null, List.of(), 0, null);
        if (target == null) throw new Rejected("missing-target", "no delay-target or scheduler-target-topic header");
        checkTarget(target);
        long due = dueTime(rec, nowMs);
        String k = control(rec.headers(), KafkaDelay.SCHEDULER_TARGET_KEY);
        byte[] key = k != null ? k.getBytes(StandardCharsets.UTF_8) : rec.key();
        return new Outcome("schedule", target, due, rec.key(), key, rec.value(), userHeaders(rec.headers()), 0, null);
    }

    private Long number(Incoming rec, String name) throws Rejected {
        String text = control(rec.headers(), name);
        if (text == null) return null;
        try {
            return parseInteger(text, name);
        } catch (IllegalArgumentException e) {
            throw new Rejected("invalid-retry-header", e.getMessage());
        }
    }

    private Outcome interpretRetry(Incoming rec, String target, byte[] id, long nowMs) throws Rejected {
        Long prev = number(rec, KafkaDelay.RETRY_ATTEMPT);
        long previous = prev == null ? 0 : prev;
        if (previous > MAX_ATTEMPTS_LIMIT) throw new Rejected("invalid-retry-header", "retry-attempt " + previous + " is too large");
        Long ff = number(rec, KafkaDelay.RETRY_FIRST_FAILED_AT);
        if (ff != null && ff < MIN_PLAUSIBLE_EPOCH_MS) {
            throw new Rejected("invalid-retry-header", "retry-first-failed-at must be epoch milliseconds");
        }
        Long lowered = number(rec, KafkaDelay.RETRY_MAX_ATTEMPTS);
        String retryAfter = control(rec.headers(), KafkaDelay.RETRY_AFTER);
        long base = rec.timestampMs() != null ? rec.timestampMs() : nowMs;
        long firstFailed = ff != null ? ff : base;
        Policy policy = retryDefault;
        long max = lowered == null ? policy.maxAttempts() : Math.min(lowered, policy.maxAttempts());
        long attempt = previous + 1;
        List<Header> headers = new ArrayList<>();
        for (Header h : userHeaders(rec.headers())) {
            if (!h.key().equals(KafkaDelay.RETRY_AFTER) && !h.key().equals(KafkaDelay.RETRY_ATTEMPT)
                    && !h.key().equals(KafkaDelay.RETRY_FIRST_FAILED_AT)) headers.add(h);
        }
        if (attempt > max) {
            String deadLetter = policy.deadLetterTopic(target);
            String detail = previous + " retries of " + max + " used for target '" + target + "'";
            try {
                checkTarget(deadLetter);
            } catch (Rejected r) {
                throw new Rejected("retries-exhausted", detail + "; its dead-letter topic is not usable");
            }
            headers.add(h(KafkaDelay.TARGET, target));
            headers.add(h(KafkaDelay.RETRY_ATTEMPT, Long.toString(previous)));
            headers.add(h(KafkaDelay.RETRY_FIRST_FAILED_AT, Long.toString(firstFailed)));
            headers.add(h(KafkaDelay.ERROR, "retries-exhausted"));
            headers.add(h(KafkaDelay.ERROR_DETAIL, detail));
            return new Outcome("exhausted", target, nowMs, id, rec.key(), rec.value(), headers, 0, deadLetter);
        }
        boolean explicit = control(rec.headers(), KafkaDelay.UNTIL) != null || control(rec.headers(), KafkaDelay.AFTER) != null;
        long due;
        if (retryAfter != null && explicit) {
            throw new Rejected("conflicting-due-time", "retry-after together with delay-until or delay-after");
        } else if (retryAfter != null) {
            try {
                due = withinMaxDelay(parseRetryAfter(retryAfter, base), nowMs);
            } catch (IllegalArgumentException e) {
                throw new Rejected("invalid-retry-header", "retry-after: " + e.getMessage());
            }
        } else if (explicit) {
            due = dueTime(rec, nowMs);
        } else {
            long seed = base ^ (attempt << 48);
            if (rec.key() != null) for (byte b : rec.key()) seed = (seed ^ (b & 0xffL)) * 0x0100_0000_01b3L;
            due = withinMaxDelay(base + policy.delayFor(attempt, unitInterval(seed)), nowMs);
        }
        headers.add(h(KafkaDelay.RETRY_ATTEMPT, Long.toString(attempt)));
        headers.add(h(KafkaDelay.RETRY_FIRST_FAILED_AT, Long.toString(firstFailed)));
        return new Outcome("retry", target, due, id, rec.key(), rec.value(), headers, attempt, null);
    }

    private static Header h(String k, String v) {
        return new Header(k, v.getBytes(StandardCharsets.UTF_8));
    }

    /** A number in [0, 1) from seed (SplitMix64), as the broker computes jitter. */
    public static double unitInterval(long seed) {
        long z = seed + 0x9E3779B97F4A7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        z ^= z >>> 31;
        return (z >>> 11) / (double) (1L << 53);
    }

}
