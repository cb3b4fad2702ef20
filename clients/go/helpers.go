package kafkadelay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DelayOption sets one property of a record built by Delayed.
type DelayOption func(*delayOptions)

// RetryOption sets one property of a retry built by Retry. (The two option types are apart so
// that an option of one cannot be given to the other: it would not compile.)
type RetryOption func(*retryOptions)

type delayOptions struct {
	key     []byte
	after   *time.Duration
	until   *time.Time
	id      string
	headers []kgo.RecordHeader
}

type retryOptions struct {
	after       *time.Duration
	topic       string
	reason      string
	maxAttempts int
}

// Key sets the record's key (kafka-delay publishes it unchanged; murmur2 picks the partition).
func Key(k []byte) DelayOption { return func(o *delayOptions) { o.key = k } }

// After makes the record due d after its timestamp (delay-after, in milliseconds).
func After(d time.Duration) DelayOption { return func(o *delayOptions) { o.after = &d } }

// Until makes the record due at t (delay-until, in epoch milliseconds).
func Until(t time.Time) DelayOption { return func(o *delayOptions) { o.until = &t } }

// ID names the pending record: a later record with the same id replaces it, Cancel drops it.
func ID(id string) DelayOption { return func(o *delayOptions) { o.id = id } }

// WithHeader adds a header of the application's (published with the record).
func WithHeader(key string, value []byte) DelayOption {
	return func(o *delayOptions) {
		o.headers = append(o.headers, kgo.RecordHeader{Key: key, Value: value})
	}
}

// RetryAfter makes a retry due d after it is sent (retry-after); without it the target's
// backoff policy decides.
func RetryAfter(d time.Duration) RetryOption { return func(o *retryOptions) { o.after = &d } }

// RetryTopic sets the topic a retry is sent to (default delay.retry).
func RetryTopic(topic string) RetryOption { return func(o *retryOptions) { o.topic = topic } }

// Reason says why the record failed (retry-reason; carried back and onto the dead letter).
func Reason(reason string) RetryOption { return func(o *retryOptions) { o.reason = reason } }

// MaxAttempts lowers the target's maximum number of retries for this record.
func MaxAttempts(n int) RetryOption { return func(o *retryOptions) { o.maxAttempts = n } }

func hdr(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }

// Delayed is a record for the delay topic topic that kafka-delay publishes to target when due:
// After its timestamp or Until a time (one of them, or neither on a fixed-delay topic such as
// delay.30s). It refuses, with an error saying what to change, what kafka-delay would send to
// its dead-letter topic: no target, both After and Until, a negative After, or an application
// header in the broker's namespace (delay-*, scheduler-*).
func Delayed(topic, target string, value []byte, opts ...DelayOption) (*kgo.Record, error) {
	var o delayOptions
	for _, f := range opts {
		f(&o)
	}
	switch {
	case target == "":
		return nil, errors.New("kafkadelay.Delayed: no target topic")
	case o.after != nil && o.until != nil:
		return nil, errors.New("kafkadelay.Delayed: give After or Until, not both")
	case o.after != nil && *o.after < 0:
		return nil, fmt.Errorf("kafkadelay.Delayed: After(%v) is negative", *o.after)
	}
	headers := []kgo.RecordHeader{}
	for _, h := range o.headers {
		if strings.HasPrefix(h.Key, "delay-") || strings.HasPrefix(h.Key, "scheduler-") {
			return nil, fmt.Errorf("kafkadelay.Delayed: header %s belongs to kafka-delay", h.Key)
		}
		headers = append(headers, h)
	}
	headers = append(headers, hdr(HeaderTarget, target))
	if o.after != nil {
		headers = append(headers, hdr(HeaderAfter, strconv.FormatInt(o.after.Milliseconds(), 10)))
	}
	if o.until != nil {
		headers = append(headers, hdr(HeaderUntil, strconv.FormatInt(o.until.UnixMilli(), 10)))
	}
	if o.id != "" {
		headers = append(headers, hdr(HeaderID, o.id))
	}
	return &kgo.Record{Topic: topic, Key: o.key, Value: value, Headers: headers}, nil
}

// Cancel drops the pending record named id. Ids are scoped to the source partition: send it
// with the same key, to the same topic, as the record it cancels.
func Cancel(topic, id string, key []byte) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: key, Value: nil, Headers: []kgo.RecordHeader{hdr(HeaderID, id)}}
}

// Attempt is the retry count of a consumed record: 0 on a first delivery, n on the n-th retry.
func Attempt(rec *kgo.Record) int {
	for _, h := range rec.Headers {
		if h.Key == HeaderRetryAttempt {
			n, err := strconv.Atoi(string(h.Value))
			if err == nil {
				return n
			}
		}
	}
	return 0
}

// Retry is the consumed record rec sent back through kafka-delay's retry topic: it returns
// to the topic it came from after the target's backoff, or after d with RetryAfter, counted
// in retry-attempt, with its key, value and headers (the broker's own are left behind).
func Retry(rec *kgo.Record, opts ...RetryOption) *kgo.Record {
	o := retryOptions{topic: "delay.retry"}
	for _, f := range opts {
		f(&o)
	}
	headers := []kgo.RecordHeader{}
	for _, h := range rec.Headers {
		drop := strings.HasPrefix(h.Key, "delay-") || h.Key == HeaderRetryAfter ||
			(o.reason != "" && h.Key == HeaderRetryReason) ||
			(o.maxAttempts > 0 && h.Key == HeaderRetryMaxAttempts)
		if !drop {
			headers = append(headers, h)
		}
	}
	headers = append(headers, hdr(HeaderTarget, rec.Topic))
	if o.after != nil {
		headers = append(headers, hdr(HeaderRetryAfter, strconv.FormatInt(o.after.Milliseconds(), 10)+"ms"))
	}
	if o.reason != "" {
		headers = append(headers, hdr(HeaderRetryReason, o.reason))
	}
	if o.maxAttempts > 0 {
		headers = append(headers, hdr(HeaderRetryMaxAttempts, strconv.Itoa(o.maxAttempts)))
	}
	return &kgo.Record{Topic: o.topic, Key: rec.Key, Value: rec.Value, Headers: headers}
}

// ShareRetryID is the delay-id of a share group's retry: the delivered record's topic, partition
// and offset, the same however often the share group delivers it.
func ShareRetryID(rec *kgo.Record) string {
	return fmt.Sprintf("share-retry:%s/%d/%d", rec.Topic, rec.Partition, rec.Offset)
}

// ShareRetry is Retry for a record consumed in a share group (KIP-932; franz-go 1.22 or newer
// with kgo.ShareGroup), named after the delivery it retries (delay-id ShareRetryID(rec)).
// Produce it, and only once Kafka has it (ProduceSync without an error) accept the record with
// rec.Ack(kgo.AckAccept). If the consumer dies between the two, the share group delivers the
// record again and the retry sent then replaces the first while that one is pending: one retry,
// not two. Ids are scoped to the retry topic's partition, which the key picks: a record without
// a key meets its earlier retry only on a retry topic of one partition.
func ShareRetry(rec *kgo.Record, opts ...RetryOption) *kgo.Record {
	r := Retry(rec, opts...)
	r.Headers = append(r.Headers, hdr(HeaderID, ShareRetryID(rec)))
	return r
}
