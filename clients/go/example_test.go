package kafkadelay_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	kafkadelay "github.com/kafka-delay/kafka-delay/clients/go"
)

// send stands for a franz-go client's ProduceSync in the README snippet.
type sender struct{ sent []*kgo.Record }

func (s *sender) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	s.sent = append(s.sent, rs...)
	return nil
}

// readmeSnippet runs the README's Go snippet as written.
func readmeSnippet(client *sender, ctx context.Context, user string, body []byte, rec *kgo.Record) error {
	// README go begin
	// a reminder in 30 minutes, replaced by a later one with the same id
	reminder, err := kafkadelay.Delayed("delay.emails", "emails", body,
		kafkadelay.Key([]byte(user)), kafkadelay.After(30*time.Minute), kafkadelay.ID("remind-"+user))
	if err != nil {
		return err // a mistake the broker would dead-letter, such as both After and Until
	}
	client.ProduceSync(ctx, reminder)
	// in a consumer of `orders`: this record cannot be processed now, retry it in 30 s
	if kafkadelay.Attempt(rec) < 5 {
		client.ProduceSync(ctx, kafkadelay.Retry(rec, kafkadelay.RetryAfter(30*time.Second),
			kafkadelay.Reason("inventory 503")))
	}
	// README go end
	return nil
}

func Example() {
	s := &sender{}
	rec := &kgo.Record{Topic: "orders", Key: []byte("order-42"), Value: []byte(`{"id":42}`)}
	if err := readmeSnippet(s, context.Background(), "u-7", []byte("hi"), rec); err != nil {
		fmt.Println(err)
	}
	for _, r := range s.sent {
		fmt.Println(r.Topic, len(r.Headers))
	}
	// Output:
	// delay.emails 3
	// delay.retry 3
}

func TestTheReadmeSnippetIsTheOneExampleRuns(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	region := strings.SplitN(strings.SplitN(string(src), "// README go begin\n", 2)[1], "\t// README go end", 2)[0]
	var want strings.Builder
	for _, l := range strings.Split(strings.TrimRight(region, "\n"), "\n") {
		want.WriteString(strings.TrimPrefix(l, "\t") + "\n")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := strings.SplitN(string(readme), "**From Go**", 2)[1]
	block := strings.SplitN(strings.SplitN(section, "```go\n", 2)[1], "```", 2)[0]
	if block != want.String() {
		t.Fatalf("README's Go block:\n%s\nthe tested one:\n%s", block, want.String())
	}
}
