//go:build e2e

// End to end with franz-go against a real Kafka and the kafka-delay binary (go test -tags e2e
// with KAFKA_DELAY_TEST_BROKERS and KAFKA_DELAY_BIN; scripts/test-external.sh sets both).
package kafkadelay

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

func num(t *testing.T, r *kgo.Record, name string) int64 {
	n, err := strconv.ParseInt(header(r, name), 10, 64)
	if err != nil {
		t.Fatalf("header %s: %v", name, err)
	}
	return n
}

// next is the first record of c for which want holds, within a minute.
func next(t *testing.T, c *kgo.Client, want func(*kgo.Record) bool) *kgo.Record {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		fs := c.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no such record within 60 s")
		}
		for _, r := range fs.Records() {
			if want(r) {
				return r
			}
		}
	}
}

func TestE2EDelayedRecordAndRetryArriveWhenDue(t *testing.T) {
	brokers, bin := os.Getenv("KAFKA_DELAY_TEST_BROKERS"), os.Getenv("KAFKA_DELAY_BIN")
	if brokers == "" || bin == "" {
		t.Fatal("set KAFKA_DELAY_TEST_BROKERS and KAFKA_DELAY_BIN (scripts/test-external.sh does)")
	}
	run := fmt.Sprintf("go_%d", time.Now().UnixNano()%1_000_000_000)
	delayTopic, retryTopic, target, dlt := "delay."+run+".in", "delay."+run+".retry", "out-"+run, "dlt-"+run
	ctx := context.Background()
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := kadm.NewClient(admin).CreateTopics(ctx, 1, 1, nil, delayTopic, retryTopic, target, dlt); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	broker := exec.Command(bin, "run", "--brokers", brokers, "--data-dir", t.TempDir(), "--http-addr", addr,
		"--group-id", "g-"+run, "--instance-id", "i-"+run, "--source-pattern", `^delay\.`+run+`\..+`,
		"--retry-topics", `^delay\.`+run+`\.retry$`, "--dead-letter-topic", dlt, "--topic-refresh", "500ms")
	if err := broker.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = broker.Process.Kill(); _ = broker.Wait() }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("kafka-delay not ready within 60 s")
		}
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{target: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()

	sent := time.Now().UnixMilli()
	rec, err := Delayed(delayTopic, target, []byte("hello"), Key([]byte("k1")), After(2*time.Second),
		WithHeader("trace-id", []byte("t-1")))
	if err != nil {
		t.Fatal(err)
	}
	if err := producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got := next(t, reader, func(r *kgo.Record) bool { return string(r.Key) == "k1" })
	due := num(t, got, "delay-due-ms")
	if due < sent+2_000-50 || num(t, got, "delay-fired-ms") < due {
		t.Fatalf("due %d fired %d for a record sent at %d, 2 s ahead", due, num(t, got, "delay-fired-ms"), sent)
	}
	if string(got.Value) != "hello" || header(got, "trace-id") != "t-1" || header(got, "delay-target") != "" || Attempt(got) != 0 {
		t.Fatalf("%+v", got)
	}

	retriedAt := time.Now().UnixMilli()
	if err := producer.ProduceSync(ctx, Retry(got, RetryTopic(retryTopic), RetryAfter(2*time.Second), Reason("inventory 503"))).FirstErr(); err != nil {
		t.Fatal(err)
	}
	back := next(t, reader, func(r *kgo.Record) bool { return string(r.Key) == "k1" && header(r, "retry-attempt") != "" })
	if Attempt(back) != 1 || num(t, back, "delay-due-ms") < retriedAt+2_000-50 || num(t, back, "delay-fired-ms") < num(t, back, "delay-due-ms") {
		t.Fatalf("retry: %+v", back)
	}
	if header(back, "trace-id") != "t-1" || header(back, "retry-reason") != "inventory 503" {
		t.Fatalf("retry headers: %+v", back.Headers)
	}
}
