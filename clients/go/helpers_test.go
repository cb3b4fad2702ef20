package kafkadelay

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

const now = uint64(1_763_700_000_000)
const sent = int64(now - 1_000)

// read is what the broker does with a produced record (timestamped sent).
func read(t *testing.T, r *kgo.Record) Outcome {
	hs := []Header{}
	for _, h := range r.Headers {
		hs = append(hs, Header{h.Key, h.Value})
	}
	out, err := DefaultContract().Interpret(Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: hs, TimestampMs: sent}, now)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// delayed is Delayed's record, failing the test on an error.
func delayed(t *testing.T, topic, target string, value []byte, opts ...DelayOption) *kgo.Record {
	t.Helper()
	rec, err := Delayed(topic, target, value, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestDelayedCancelAndRetryReadAsIntended(t *testing.T) {
	out := read(t, delayed(t, "delay.orders", "orders", []byte("v"), Key([]byte("k")), After(30*time.Second), ID("job-1"),
		WithHeader("trace-id", []byte("t-1"))))
	if out.Kind != "schedule" || out.Target != "orders" || out.DueMs != uint64(sent)+30_000 || string(out.ID) != "job-1" {
		t.Fatalf("%+v", out)
	}
	if len(out.Headers) != 1 || out.Headers[0].Key != "trace-id" {
		t.Fatalf("user headers %+v", out.Headers)
	}
	until := time.UnixMilli(int64(now) + 60_000)
	if out := read(t, delayed(t, "delay.orders", "orders", []byte("v"), Until(until))); out.DueMs != now+60_000 {
		t.Fatalf("until: %+v", out)
	}
	if out := read(t, Cancel("delay.orders", "job-1", []byte("k"))); out.Kind != "cancel" || string(out.ID) != "job-1" {
		t.Fatalf("cancel: %+v", out)
	}
	consumed := &kgo.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v"),
		Headers: []kgo.RecordHeader{{Key: "trace-id", Value: []byte("t")}, {Key: "delay-origin-offset", Value: []byte("7")}}}
	if Attempt(consumed) != 0 {
		t.Fatal("a first delivery is attempt 0")
	}
	back := read(t, Retry(consumed, RetryAfter(2*time.Second), Reason("inventory 503")))
	if back.Kind != "retry" || back.Target != "orders" || back.Attempt != 1 || back.DueMs != uint64(sent)+2_000 {
		t.Fatalf("retry: %+v", back)
	}
	again := &kgo.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v")}
	for _, h := range back.Headers {
		again.Headers = append(again.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if Attempt(again) != 1 {
		t.Fatalf("attempt %d", Attempt(again))
	}
	if out := read(t, Retry(again, MaxAttempts(1))); out.Kind != "exhausted" || out.DeadLetter != "orders.dlt" {
		t.Fatalf("exhausted: %+v", out)
	}
}

func TestDelayedRefusesWhatTheBrokerWouldDeadLetterWithAnError(t *testing.T) {
	cases := map[string][]DelayOption{
		"give After or Until, not both":  {After(time.Second), Until(time.Now())},
		"is negative":                    {After(-time.Second)},
		"header delay-target belongs to": {WithHeader("delay-target", []byte("x"))},
		"header scheduler-epoch belongs": {WithHeader("scheduler-epoch", []byte("1"))},
	}
	for want, opts := range cases {
		rec, err := Delayed("delay.orders", "orders", []byte("v"), opts...)
		if err == nil || !strings.Contains(err.Error(), want) || rec != nil {
			t.Errorf("%s: got %v, %v", want, rec, err)
		}
	}
	if _, err := Delayed("delay.orders", "", []byte("v")); err == nil || !strings.Contains(err.Error(), "no target") {
		t.Errorf("no target: %v", err)
	}
}

func TestAShareGroupsRetryIsNamedAfterTheDeliveryItRetries(t *testing.T) {
	consumed := &kgo.Record{Topic: "orders", Partition: 3, Offset: 41, Key: []byte("k"), Value: []byte("v"),
		Headers: []kgo.RecordHeader{{Key: "trace-id", Value: []byte("t")}}}
	first, again := read(t, ShareRetry(consumed, RetryAfter(30*time.Second))), read(t, ShareRetry(consumed))
	if string(first.ID) != "share-retry:orders/3/41" || string(again.ID) != string(first.ID) {
		t.Fatalf("a redelivery's retry must replace the first: ids %q and %q", first.ID, again.ID)
	}
	if first.Kind != "retry" || first.Target != "orders" || first.DueMs != uint64(sent)+30_000 {
		t.Fatalf("not a retry of orders in 30 s: %+v", first)
	}
	next := *consumed
	next.Offset = 42
	if string(read(t, ShareRetry(&next)).ID) == string(first.ID) {
		t.Fatal("another delivery needs another id")
	}
}
