//go:build e2e

package sharegroup

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"testing"
	"time"

	kafkadelay "github.com/kafka-delay/kafka-delay/clients/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var after = map[string]time.Duration{"flaky": 2 * time.Second, "crash": 6 * time.Second, "doomed": time.Second}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func shareConsumer(t *testing.T, brokers, group, topic string) *kgo.Client {
	c, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ShareGroup(group), kgo.ConsumeTopics(topic))
	must(t, err)
	return c
}

// readAll is every record of a one-partition topic from its start, read_committed.
func readAll(t *testing.T, brokers, topic string) []*kgo.Record {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	must(t, err)
	defer c.Close()
	ends, err := kadm.NewClient(c).ListEndOffsets(ctx, topic)
	must(t, err)
	end, _ := ends.Lookup(topic, 0)
	var out []*kgo.Record
	for len(out) == 0 || out[len(out)-1].Offset < end.Offset-1 {
		if end.Offset == 0 {
			break
		}
		fs := c.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%s not read to its end (%d) within 30 s", topic, end.Offset)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// A share group's consumer fails records and hands them to kafka-delay with ShareRetry: each
// comes back no earlier than its retry-after by the test's own clock, a consumer that releases
// a record after sending its retry (as a dead one's lock running out would) makes one retry,
// and a record that always fails is dead-lettered once.
func TestE2EShareGroupRetriesComeBackAfterTheirRetryAfterOnce(t *testing.T) {
	brokers, bin := os.Getenv("KAFKA_DELAY_TEST_BROKERS"), os.Getenv("KAFKA_DELAY_BIN")
	if brokers == "" || bin == "" {
		t.Fatal("set KAFKA_DELAY_TEST_BROKERS and KAFKA_DELAY_BIN (scripts/test-external.sh does)")
	}
	run := fmt.Sprintf("goshare_%d", time.Now().UnixNano()%1_000_000_000)
	work, retryTopic, dlt, group := "work-"+run, "delay."+run+".retry", "dlt-"+run, "g-"+run
	ctx := context.Background()
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	must(t, err)
	defer admin.Close()
	adm := kadm.NewClient(admin)
	_, err = adm.CreateTopics(ctx, 1, 1, nil, work, retryTopic, dlt)
	must(t, err)
	// A share group starts at the log's end unless told otherwise (a group config).
	// (kadm has no call for group configs: the request itself, resource type GROUP.)
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name, cfg.Value = "share.auto.offset.reset", kmsg.StringPtr("earliest")
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, admin)
	must(t, err)
	for _, r := range resp.Resources {
		if r.ErrorCode != 0 {
			t.Fatalf("share.auto.offset.reset of group %s: error %d %v", group, r.ErrorCode, r.ErrorMessage)
		}
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := l.Addr().String()
	l.Close()
	broker := exec.Command(bin, "run", "--brokers", brokers, "--data-dir", t.TempDir(), "--http-addr", addr,
		"--group-id", "kd-"+run, "--instance-id", "i-"+run, "--source-pattern", `^delay\.`+run+`\..+`,
		"--retry-topics", `^delay\.`+run+`\.retry$`, "--topic-refresh", "500ms",
		"--retry-policy", "^"+work+"$=backoff=fixed,delay=1s,max-attempts=2,dead-letter="+dlt)
	must(t, broker.Start())
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
	must(t, err)
	defer producer.Close()

	// A consumer that sends its retry and then gives the record back unacknowledged, as a dead
	// consumer's lock running out would: the share group delivers it again.
	must(t, producer.ProduceSync(ctx, &kgo.Record{Topic: work, Key: []byte("crash"), Value: []byte("c")}).FirstErr())
	failedAt := map[string]time.Time{}
	dying := shareConsumer(t, brokers, group, work)
	for deadline := time.Now().Add(60 * time.Second); failedAt["crash"].IsZero(); {
		pctx, cancel := context.WithDeadline(ctx, deadline)
		fs := dying.PollFetches(pctx)
		cancel()
		if time.Now().After(deadline) {
			t.Fatal("the share group delivered nothing in 60 s")
		}
		for _, r := range fs.Records() {
			failedAt["crash"] = time.Now()
			must(t, producer.ProduceSync(ctx, kafkadelay.ShareRetry(r, kafkadelay.RetryTopic(retryTopic),
				kafkadelay.RetryAfter(after["crash"]))).FirstErr())
			r.Ack(kgo.AckRelease)
		}
	}
	must(t, dying.FlushAcks(ctx))
	dying.Close()

	must(t, producer.ProduceSync(ctx, &kgo.Record{Topic: work, Key: []byte("flaky"), Value: []byte("f")},
		&kgo.Record{Topic: work, Key: []byte("doomed"), Value: []byte("d")}).FirstErr())
	seen, processed, crashRedelivery := map[string][]int{}, []string{}, int32(0)
	consumer := shareConsumer(t, brokers, group, work)
	deadline := time.Now().Add(90 * time.Second)
	for len(processed) < 2 || len(seen["doomed"]) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("not done in 90 s: seen %v, processed %v", seen, processed)
		}
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := consumer.PollFetches(pctx)
		cancel()
		for _, r := range fs.Records() {
			now, k, n := time.Now(), string(r.Key), kafkadelay.Attempt(r)
			seen[k] = append(seen[k], n)
			if n > 0 && now.Sub(failedAt[k]) < after[k] {
				t.Fatalf("%s attempt %d back %v after its failure, before its retry-after", k, n, now.Sub(failedAt[k]))
			}
			if k == "crash" && n == 0 {
				crashRedelivery = r.DeliveryCount()
			}
			if map[string]bool{"flaky": n < 2, "crash": n == 0, "doomed": true}[k] {
				failedAt[k] = now
				retry := kafkadelay.ShareRetry(r, kafkadelay.RetryTopic(retryTopic), kafkadelay.RetryAfter(after[k]),
					kafkadelay.Reason(k+" failed"))
				must(t, producer.ProduceSync(ctx, retry).FirstErr())
			} else {
				processed = append(processed, k)
			}
			r.Ack(kgo.AckAccept)
		}
		must(t, consumer.FlushAcks(ctx))
	}
	consumer.Close()
	// 2, or more when the dying client had fetched the released record again before it closed
	if crashRedelivery < 2 {
		t.Fatalf("the released record's later delivery counted %d, want 2 or more", crashRedelivery)
	}
	if !reflect.DeepEqual(seen["flaky"], []int{0, 1, 2}) || !reflect.DeepEqual(seen["doomed"], []int{0, 1, 2}) {
		t.Fatalf("attempts seen: %v", seen)
	}

	time.Sleep(after["crash"] + 2*time.Second) // late duplicates have time to show
	returned := map[string]int{}
	for _, r := range readAll(t, brokers, work) {
		if n := kafkadelay.Attempt(r); n > 0 {
			returned[fmt.Sprintf("%s#%d", r.Key, n)]++
		}
	}
	want := map[string]int{"crash#1": 1, "flaky#1": 1, "flaky#2": 1, "doomed#1": 1, "doomed#2": 1}
	if !reflect.DeepEqual(returned, want) {
		t.Fatalf("retries back on %s: %v, want %v", work, returned, want)
	}
	dead := readAll(t, brokers, dlt)
	if len(dead) != 1 || string(dead[0].Key) != "doomed" || header(dead[0], "delay-error") != "retries-exhausted" ||
		header(dead[0], "retry-reason") != "doomed failed" {
		t.Fatalf("dead letters: %d %+v", len(dead), dead)
	}
}
