package kafkadelay

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// vectorValue is a value of the vectors: a string, null, {"hex": ..} or {"repeat", "times"}.
func vectorValue(t *testing.T, raw json.RawMessage) []byte {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return []byte(x)
	case map[string]any:
		if h, ok := x["hex"].(string); ok {
			b, err := hex.DecodeString(h)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		return []byte(strings.Repeat(x["repeat"].(string), int(x["times"].(float64))))
	}
	t.Fatalf("not a vector value: %s", raw)
	return nil
}

type vectors struct {
	NowMs    uint64 `json:"now_ms"`
	Contract struct {
		SourcePattern  string `json:"source_pattern"`
		RetryTopics    string `json:"retry_topics"`
		MaxDelayMs     uint64 `json:"max_delay_ms"`
		MaxRecordBytes int    `json:"max_record_bytes"`
		RetryDefault   string `json:"retry_default"`
	} `json:"contract"`
	Cases []struct {
		Name        string                     `json:"name"`
		Topic       string                     `json:"topic"`
		TimestampMs int64                      `json:"timestamp_ms"`
		Key         json.RawMessage            `json:"key"`
		Value       json.RawMessage            `json:"value"`
		Headers     [][]json.RawMessage        `json:"headers"`
		Expect      map[string]json.RawMessage `json:"expect"`
	} `json:"cases"`
}

type want struct {
	Target     string              `json:"target"`
	DueMs      uint64              `json:"due_ms"`
	ID         json.RawMessage     `json:"id"`
	Key        json.RawMessage     `json:"key"`
	Value      json.RawMessage     `json:"value"`
	Headers    [][]json.RawMessage `json:"headers"`
	Attempt    uint64              `json:"attempt"`
	DeadLetter string              `json:"dead_letter"`
}

func headersOf(t *testing.T, pairs [][]json.RawMessage) []Header {
	out := []Header{}
	for _, p := range pairs {
		var k string
		if err := json.Unmarshal(p[0], &k); err != nil {
			t.Fatal(err)
		}
		out = append(out, Header{k, vectorValue(t, p[1])})
	}
	return out
}

func equalHeaders(a, b []Header) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) || (a[i].Value == nil) != (b[i].Value == nil) {
			return false
		}
	}
	return true
}

// TestSharedContractVectors: the Go contract gives every outcome the broker gives.
func TestSharedContractVectors(t *testing.T) {
	raw, err := os.ReadFile("../../schemas/contract-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	policy, err := ParsePolicy(v.Contract.RetryDefault, DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	c := Contract{
		SourcePattern:  regexp.MustCompile(v.Contract.SourcePattern),
		RetryTopics:    regexp.MustCompile(v.Contract.RetryTopics),
		MaxDelayMs:     v.Contract.MaxDelayMs,
		MaxRecordBytes: v.Contract.MaxRecordBytes,
		RetryDefault:   policy,
	}
	if len(v.Cases) < 50 {
		t.Fatalf("only %d vectors", len(v.Cases))
	}
	for _, tc := range v.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			rec := Record{Topic: tc.Topic, Key: vectorValue(t, tc.Key), Value: vectorValue(t, tc.Value),
				Headers: headersOf(t, tc.Headers), TimestampMs: tc.TimestampMs}
			got, err := c.Interpret(rec, v.NowMs)
			for kind, raw := range tc.Expect {
				if kind == "reject" {
					var code string
					_ = json.Unmarshal(raw, &code)
					rej, ok := err.(*Rejected)
					if !ok || rej.Code != code || rej.Detail == "" {
						t.Fatalf("want reject %s, got %+v, %v", code, got, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("want %s, got %v", kind, err)
				}
				var w want
				if err := json.Unmarshal(raw, &w); err != nil {
					t.Fatal(err)
				}
				if got.Kind != kind {
					t.Fatalf("want %s, got %+v", kind, got)
				}
				if kind == "cancel" {
					if !bytes.Equal(got.ID, vectorValue(t, w.ID)) {
						t.Fatalf("id %q", got.ID)
					}
					return
				}
				if got.Target != w.Target || got.DueMs != w.DueMs {
					t.Fatalf("target %s due %d, want %s %d", got.Target, got.DueMs, w.Target, w.DueMs)
				}
				switch kind {
				case "schedule":
					if id := vectorValue(t, w.ID); !bytes.Equal(got.ID, id) || (id == nil) != (got.ID == nil) {
						t.Fatalf("id %q", got.ID)
					}
					if w.Key != nil && !bytes.Equal(got.Key, vectorValue(t, w.Key)) {
						t.Fatalf("key %q", got.Key)
					}
					if w.Value != nil && (got.Value == nil) != (vectorValue(t, w.Value) == nil) {
						t.Fatalf("value %q", got.Value)
					}
					if w.Headers != nil && !equalHeaders(got.Headers, headersOf(t, w.Headers)) {
						t.Fatalf("headers %+v", got.Headers)
					}
				case "retry", "exhausted":
					if kind == "retry" && got.Attempt != w.Attempt {
						t.Fatalf("attempt %d", got.Attempt)
					}
					if kind == "exhausted" && got.DeadLetter != w.DeadLetter {
						t.Fatalf("dead letter %s", got.DeadLetter)
					}
					for _, h := range headersOf(t, w.Headers) {
						var vals [][]byte
						for _, g := range got.Headers {
							if g.Key == h.Key {
								vals = append(vals, g.Value)
							}
						}
						if len(vals) != 1 || !bytes.Equal(vals[0], h.Value) {
							t.Fatalf("header %s: %q", h.Key, vals)
						}
					}
				}
			}
		})
	}
}
