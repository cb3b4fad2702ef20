// Package kafkadelay builds records for kafka-delay (delayed records, cancels, retries) as
// franz-go records, and holds the header contract as the broker applies it: Interpret says
// what the broker does with a consumed record. Interpret is tested on the shared vectors in
// schemas/contract-vectors.json, which the broker's own contract tests read as well.
package kafkadelay

import (
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Header names of the contract.
const (
	HeaderTarget               = "delay-target"
	HeaderUntil                = "delay-until"
	HeaderAfter                = "delay-after"
	HeaderID                   = "delay-id"
	HeaderSchedulerEpoch       = "scheduler-epoch"
	HeaderSchedulerTargetTopic = "scheduler-target-topic"
	HeaderSchedulerTargetKey   = "scheduler-target-key"
	HeaderError                = "delay-error"
	HeaderErrorDetail          = "delay-error-detail"
	HeaderRetryAfter           = "retry-after"
	HeaderRetryAttempt         = "retry-attempt"
	HeaderRetryFirstFailedAt   = "retry-first-failed-at"
	HeaderRetryMaxAttempts     = "retry-max-attempts"
	HeaderRetryReason          = "retry-reason"
)

const (
	maxAttemptsLimit    = 1_000_000
	minPlausibleEpochMs = 100_000_000_000
	maxTopicLen         = 249
)

var (
	units = []struct {
		name string
		ms   uint64
	}{{"d", 86_400_000}, {"h", 3_600_000}, {"m", 60_000}, {"s", 1_000}, {"ms", 1}}
	legalTopic   = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	retryManaged = []string{HeaderRetryAfter, HeaderRetryAttempt, HeaderRetryFirstFailedAt}
)

// Header is one record header; a nil Value is a header without a value.
type Header struct {
	Key   string
	Value []byte
}

// Rejected is a record the broker dead-letters at ingest; Code is its delay-error.
type Rejected struct {
	Code   string
	Detail string
}

func (r *Rejected) Error() string { return r.Code + ": " + r.Detail }

func reject(code, format string, args ...any) error {
	return &Rejected{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// Policy is a retry backoff policy (the broker's --retry-default and --retry-policy keys).
type Policy struct {
	Backoff     string // "exponential" or "fixed"
	DelayMs     uint64
	Factor      float64
	MaxDelayMs  uint64
	Jitter      float64
	MaxAttempts uint64
	DeadLetter  string // "{target}" is replaced by the target
}

// DefaultPolicy is the broker's default retry policy.
func DefaultPolicy() Policy {
	return Policy{"exponential", 1_000, 2, 300_000, 0.1, 5, "{target}.dlt"}
}

// ParsePolicy reads "key=value,..." over base.
func ParsePolicy(spec string, base Policy) (Policy, error) {
	p := base
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		key, value, _ := strings.Cut(part, "=")
		var err error
		switch key {
		case "backoff":
			if value != "exponential" && value != "fixed" {
				return p, fmt.Errorf("backoff %q (use exponential or fixed)", value)
			}
			p.Backoff = value
		case "delay":
			p.DelayMs, err = ParseDurationMs(value)
		case "factor":
			p.Factor, err = strconv.ParseFloat(value, 64)
		case "max-delay":
			p.MaxDelayMs, err = ParseDurationMs(value)
		case "jitter":
			p.Jitter, err = strconv.ParseFloat(value, 64)
		case "max-attempts":
			p.MaxAttempts, err = strconv.ParseUint(value, 10, 32)
		case "dead-letter":
			p.DeadLetter = value
		default:
			return p, fmt.Errorf("unknown key %q", key)
		}
		if err != nil {
			return p, fmt.Errorf("%s: %w", key, err)
		}
	}
	return p, nil
}

// DelayFor is the wait before retry attempt (1-based), u uniform in [0, 1) for the jitter.
func (p Policy) DelayFor(attempt uint64, u float64) uint64 {
	n := attempt
	if n < 1 {
		n = 1
	}
	n--
	if n > 1_000 {
		n = 1_000
	}
	raw := float64(p.DelayMs)
	if p.Backoff != "fixed" {
		raw = math.Min(float64(p.DelayMs)*math.Pow(p.Factor, float64(n)), float64(p.MaxDelayMs))
	}
	j := raw * (1 + p.Jitter*(2*math.Min(math.Max(u, 0), 1)-1))
	if p.Backoff != "fixed" {
		j = math.Min(j, float64(p.MaxDelayMs))
	}
	return uint64(math.Max(math.Round(j), 0))
}

// Contract holds the rules the broker checks records against (its flags of the same names).
type Contract struct {
	SourcePattern        *regexp.Regexp
	RetryTopics          *regexp.Regexp
	MaxDelayMs           uint64
	MaxRecordBytes       int
	RetryDefault         Policy
	TargetAllow          *regexp.Regexp
	AllowInternalTargets bool
}

// DefaultContract is the broker's default configuration.
func DefaultContract() Contract {
	return Contract{
		SourcePattern:  regexp.MustCompile(`^delay\..+`),
		RetryTopics:    regexp.MustCompile(`^delay\.retry$`),
		MaxDelayMs:     365 * 86_400_000,
		MaxRecordBytes: 1 << 20,
		RetryDefault:   DefaultPolicy(),
	}
}

// Record is a consumed record, as the broker sees it. TimestampMs < 0 means none.
type Record struct {
	Topic       string
	Key, Value  []byte
	Headers     []Header
	TimestampMs int64
}

// Outcome is what the broker does with a record: Kind is schedule, retry, exhausted or cancel.
type Outcome struct {
	Kind       string
	Target     string
	DueMs      uint64
	ID         []byte
	Key, Value []byte
	Headers    []Header
	Attempt    uint64
	DeadLetter string
}

// Interpret says what the broker does with rec at wall-clock time nowMs; the error is a
// *Rejected with the delay-error code.
func (c Contract) Interpret(rec Record, nowMs uint64) (Outcome, error) {
	size := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		size += len(h.Key) + len(h.Value)
	}
	if size > c.MaxRecordBytes {
		return Outcome{}, reject("oversized", "record is %d bytes", size)
	}
	target, err := control(rec.Headers, HeaderTarget)
	if err != nil {
		return Outcome{}, err
	}
	compatTarget, err := control(rec.Headers, HeaderSchedulerTargetTopic)
	if err != nil {
		return Outcome{}, err
	}
	id, err := control(rec.Headers, HeaderID)
	if err != nil {
		return Outcome{}, err
	}
	epoch, err := control(rec.Headers, HeaderSchedulerEpoch)
	if err != nil {
		return Outcome{}, err
	}
	if target == nil && (compatTarget != nil || epoch != nil || (rec.Value == nil && id == nil && rec.Key != nil)) {
		return c.interpretCompat(rec, compatTarget, nowMs)
	}
	var idb []byte
	if id != nil {
		idb = []byte(*id)
	}
	if rec.Value == nil && id != nil {
		return Outcome{Kind: "cancel", ID: idb}, nil
	}
	if target == nil {
		return Outcome{}, reject("missing-target", "no delay-target header")
	}
	if err := c.CheckTarget(*target); err != nil {
		return Outcome{}, err
	}
	retryAfter, err := control(rec.Headers, HeaderRetryAfter)
	if err != nil {
		return Outcome{}, err
	}
	if c.RetryTopics.MatchString(rec.Topic) || retryAfter != nil {
		return c.interpretRetry(rec, *target, idb, nowMs)
	}
	due, err := c.dueTime(rec, nowMs)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{Kind: "schedule", Target: *target, DueMs: due, ID: idb, Key: rec.Key, Value: rec.Value,
		Headers: userHeaders(rec.Headers)}, nil
}

// CheckTarget checks a target topic name against Kafka's rules and the broker's policy.
func (c Contract) CheckTarget(t string) error {
	switch {
	case t == "":
		return reject("invalid-target", "target topic is empty")
	case len(t) > maxTopicLen:
		return reject("invalid-target", "target topic is longer than 249 characters")
	case t == "." || t == "..":
		return reject("invalid-target", "%q is not a legal topic name", t)
	case !legalTopic.MatchString(t):
		return reject("invalid-target", "%q has characters Kafka does not allow", t)
	case strings.HasPrefix(t, "__") && !c.AllowInternalTargets:
		return reject("target-internal", "%q is internal", t)
	case c.SourcePattern.MatchString(t):
		return reject("target-loop", "%q matches the source pattern and would loop", t)
	case c.TargetAllow != nil && !c.TargetAllow.MatchString(t):
		return reject("target-not-allowed", "%q does not match the allow-list", t)
	}
	return nil
}

func control(headers []Header, name string) (*string, error) {
	var found *string
	for _, h := range headers {
		if h.Key != name {
			continue
		}
		if h.Value == nil {
			return nil, reject("invalid-header", "header %s has no value", name)
		}
		if !utf8.Valid(h.Value) {
			return nil, reject("invalid-header", "header %s is not UTF-8", name)
		}
		text := string(h.Value)
		if found != nil && *found != text {
			return nil, reject("conflicting-headers", "header %s appears with different values", name)
		}
		found = &text
	}
	return found, nil
}

func userHeaders(headers []Header) []Header {
	out := []Header{}
	for _, h := range headers {
		if !strings.HasPrefix(h.Key, "delay-") && !strings.HasPrefix(h.Key, "scheduler-") {
			out = append(out, h)
		}
	}
	return out
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ParseDurationMs reads 250ms, 30s, 5m, 2h, 1d, 1h30m: whole numbers, units largest first.
func ParseDurationMs(text string) (uint64, error) {
	if text == "" {
		return 0, fmt.Errorf("empty duration")
	}
	var total uint64
	last := -1
	for i := 0; i < len(text); {
		start := i
		for i < len(text) && text[i] >= '0' && text[i] <= '9' {
			i++
		}
		if start == i {
			return 0, fmt.Errorf("%q is not a duration (like 30s, 5m, 1h30m, 250ms)", text)
		}
		number, err := strconv.ParseUint(text[start:i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is out of range", text)
		}
		us := i
		for i < len(text) && ((text[i] >= 'a' && text[i] <= 'z') || (text[i] >= 'A' && text[i] <= 'Z')) {
			i++
		}
		rank := -1
		for r, u := range units {
			if u.name == text[us:i] {
				rank = r
			}
		}
		if rank < 0 {
			return 0, fmt.Errorf("%q needs a unit: d, h, m, s or ms", text)
		}
		if rank <= last {
			return 0, fmt.Errorf("%q repeats a unit or puts a smaller one first", text)
		}
		last = rank
		if number > math.MaxUint64/units[rank].ms || total > math.MaxUint64-number*units[rank].ms {
			return 0, fmt.Errorf("%q is out of range", text)
		}
		total += number * units[rank].ms
	}
	return total, nil
}

func parseInteger(text, what string) (uint64, error) {
	if text == "" {
		return 0, fmt.Errorf("empty %s", what)
	}
	if len(text) > 1 && text[0] == '-' && allDigits(text[1:]) {
		return 0, fmt.Errorf("%s %q is negative", what, text)
	}
	if !allDigits(text) {
		return 0, fmt.Errorf("%s %q is not a whole number of digits", what, text)
	}
	v, err := strconv.ParseUint(text, 10, 64)
	if err != nil || v > math.MaxInt64 {
		return 0, fmt.Errorf("%s %q is out of range", what, text)
	}
	return v, nil
}

func parseEpochMsOrRFC3339(text string) (uint64, error) {
	if allDigits(text) || (strings.HasPrefix(text, "-") && !strings.Contains(text, "T")) {
		ms, err := parseInteger(text, "epoch milliseconds")
		if err != nil {
			return 0, err
		}
		if ms < minPlausibleEpochMs {
			return 0, fmt.Errorf("%q looks like epoch seconds (multiply by 1000)", text)
		}
		return ms, nil
	}
	t, err := time.Parse(time.RFC3339Nano, text)
	if err != nil || t.UnixMilli() < 0 {
		return 0, fmt.Errorf("%q is neither epoch milliseconds nor RFC 3339", text)
	}
	return uint64(t.UnixMilli()), nil
}

func parseRetryAfter(text string, baseMs uint64) (uint64, error) {
	digits := strings.TrimPrefix(text, "-")
	if digits != "" && allDigits(digits) {
		secs, err := parseInteger(text, "seconds")
		if err != nil {
			return 0, err
		}
		return baseMs + secs*1_000, nil
	}
	if strings.Contains(text, ",") || strings.HasSuffix(text, "GMT") {
		t, err := http.ParseTime(text)
		if err != nil {
			return 0, fmt.Errorf("%q is not an HTTP-date", text)
		}
		return uint64(t.UnixMilli()), nil
	}
	ms, err := ParseDurationMs(text)
	return baseMs + ms, err
}

func (c Contract) withinMaxDelay(due, nowMs uint64) (uint64, error) {
	if due > nowMs+c.MaxDelayMs {
		return 0, reject("due-too-far", "due time %d is over the maximum delay", due)
	}
	return due, nil
}

func base(rec Record, nowMs uint64) uint64 {
	if rec.TimestampMs >= 0 {
		return uint64(rec.TimestampMs)
	}
	return nowMs
}

func (c Contract) dueTime(rec Record, nowMs uint64) (uint64, error) {
	until, err := control(rec.Headers, HeaderUntil)
	if err != nil {
		return 0, err
	}
	after, err := control(rec.Headers, HeaderAfter)
	if err != nil {
		return 0, err
	}
	epoch, err := control(rec.Headers, HeaderSchedulerEpoch)
	if err != nil {
		return 0, err
	}
	given := 0
	for _, g := range []*string{until, after, epoch} {
		if g != nil {
			given++
		}
	}
	if given > 1 {
		return 0, reject("conflicting-due-time", "more than one of delay-until, delay-after and scheduler-epoch")
	}
	b := base(rec, nowMs)
	var due uint64
	switch {
	case until != nil:
		due, err = parseEpochMsOrRFC3339(*until)
	case after != nil:
		var ms uint64
		if d := strings.TrimPrefix(*after, "-"); d != "" && allDigits(d) {
			ms, err = parseInteger(*after, "milliseconds")
		} else {
			ms, err = ParseDurationMs(*after)
		}
		if err == nil && ms > math.MaxUint64-b {
			err = fmt.Errorf("delay-after %q overflows", *after)
		}
		due = b + ms
	case epoch != nil:
		var secs uint64
		secs, err = parseInteger(*epoch, "epoch seconds")
		due = secs * 1_000
	default:
		dot := strings.LastIndexByte(rec.Topic, '.')
		fixed, ferr := ParseDurationMs(rec.Topic[dot+1:])
		if dot < 0 || ferr != nil {
			return 0, reject("missing-due-time", "no delay-until or delay-after header")
		}
		due = b + fixed
	}
	if err != nil {
		return 0, reject("invalid-due-time", "%v", err)
	}
	return c.withinMaxDelay(due, nowMs)
}

func (c Contract) interpretCompat(rec Record, target *string, nowMs uint64) (Outcome, error) {
	if len(rec.Key) == 0 {
		return Outcome{}, reject("missing-id", "scheduler-* record without a key: the key is the schedule id")
	}
	if rec.Value == nil {
		return Outcome{Kind: "cancel", ID: rec.Key}, nil
	}
	if target == nil {
		return Outcome{}, reject("missing-target", "no delay-target or scheduler-target-topic header")
	}
	if err := c.CheckTarget(*target); err != nil {
		return Outcome{}, err
	}
	due, err := c.dueTime(rec, nowMs)
	if err != nil {
		return Outcome{}, err
	}
	key := rec.Key
	k, err := control(rec.Headers, HeaderSchedulerTargetKey)
	if err != nil {
		return Outcome{}, err
	}
	if k != nil {
		key = []byte(*k)
	}
	return Outcome{Kind: "schedule", Target: *target, DueMs: due, ID: rec.Key, Key: key, Value: rec.Value,
		Headers: userHeaders(rec.Headers)}, nil
}

func (c Contract) interpretRetry(rec Record, target string, id []byte, nowMs uint64) (Outcome, error) {
	number := func(name string) (*uint64, error) {
		text, err := control(rec.Headers, name)
		if err != nil || text == nil {
			return nil, err
		}
		v, err := parseInteger(*text, name)
		if err != nil {
			return nil, reject("invalid-retry-header", "%v", err)
		}
		return &v, nil
	}
	prev, err := number(HeaderRetryAttempt)
	if err != nil {
		return Outcome{}, err
	}
	previous := uint64(0)
	if prev != nil {
		previous = *prev
	}
	if previous > maxAttemptsLimit {
		return Outcome{}, reject("invalid-retry-header", "retry-attempt %d is over %d", previous, maxAttemptsLimit)
	}
	ff, err := number(HeaderRetryFirstFailedAt)
	if err != nil {
		return Outcome{}, err
	}
	if ff != nil && *ff < minPlausibleEpochMs {
		return Outcome{}, reject("invalid-retry-header", "retry-first-failed-at must be epoch milliseconds")
	}
	lowered, err := number(HeaderRetryMaxAttempts)
	if err != nil {
		return Outcome{}, err
	}
	retryAfter, err := control(rec.Headers, HeaderRetryAfter)
	if err != nil {
		return Outcome{}, err
	}
	b := base(rec, nowMs)
	firstFailed := b
	if ff != nil {
		firstFailed = *ff
	}
	policy := c.RetryDefault
	max := policy.MaxAttempts
	if lowered != nil && *lowered < max {
		max = *lowered
	}
	attempt := previous + 1
	headers := []Header{}
	for _, h := range userHeaders(rec.Headers) {
		managed := false
		for _, m := range retryManaged {
			managed = managed || h.Key == m
		}
		if !managed {
			headers = append(headers, h)
		}
	}
	if attempt > max {
		deadLetter := strings.ReplaceAll(policy.DeadLetter, "{target}", target)
		detail := fmt.Sprintf("%d retries of %d used for target '%s'", previous, max, target)
		if err := c.CheckTarget(deadLetter); err != nil && err.(*Rejected).Code != "target-not-allowed" {
			return Outcome{}, reject("retries-exhausted", "%s; its dead-letter topic is not usable", detail)
		}
		headers = append(headers,
			Header{HeaderTarget, []byte(target)},
			Header{HeaderRetryAttempt, []byte(strconv.FormatUint(previous, 10))},
			Header{HeaderRetryFirstFailedAt, []byte(strconv.FormatUint(firstFailed, 10))},
			Header{HeaderError, []byte("retries-exhausted")},
			Header{HeaderErrorDetail, []byte(detail)})
		return Outcome{Kind: "exhausted", Target: target, DeadLetter: deadLetter, DueMs: nowMs, ID: id,
			Key: rec.Key, Value: rec.Value, Headers: headers}, nil
	}
	until, _ := control(rec.Headers, HeaderUntil)
	after, _ := control(rec.Headers, HeaderAfter)
	explicit := until != nil || after != nil
	var due uint64
	switch {
	case retryAfter != nil && explicit:
		return Outcome{}, reject("conflicting-due-time", "retry-after together with delay-until or delay-after")
	case retryAfter != nil:
		d, err := parseRetryAfter(*retryAfter, b)
		if err != nil {
			return Outcome{}, reject("invalid-retry-header", "retry-after: %v", err)
		}
		if due, err = c.withinMaxDelay(d, nowMs); err != nil {
			return Outcome{}, err
		}
	case explicit:
		if due, err = c.dueTime(rec, nowMs); err != nil {
			return Outcome{}, err
		}
	default:
		seed := b ^ attempt<<48
		for _, k := range rec.Key {
			seed = (seed ^ uint64(k)) * 0x0100_0000_01b3
		}
		if due, err = c.withinMaxDelay(b+policy.DelayFor(attempt, UnitInterval(seed)), nowMs); err != nil {
			return Outcome{}, err
		}
	}
	headers = append(headers,
		Header{HeaderRetryAttempt, []byte(strconv.FormatUint(attempt, 10))},
		Header{HeaderRetryFirstFailedAt, []byte(strconv.FormatUint(firstFailed, 10))})
	return Outcome{Kind: "retry", Target: target, DueMs: due, ID: id, Key: rec.Key, Value: rec.Value,
		Headers: headers, Attempt: attempt}, nil
}

// UnitInterval is a number in [0, 1) from seed (SplitMix64), as the broker computes jitter.
func UnitInterval(seed uint64) float64 {
	z := seed + 0x9E37_79B9_7F4A_7C15
	z = (z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9
	z = (z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB
	z ^= z >> 31
	return float64(z>>11) / float64(uint64(1)<<53)
}
