package transport_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

// The benchmarks measure what the Transport adds to a request under the
// limit on a loopback server: compare BenchmarkMemoryStore and
// BenchmarkRedisStore with BenchmarkBare.
//
//	go test ./transport -run '^$' -bench . -benchmem -count 3

// benchRule is high enough that no request ever waits.
const benchRule = "*=100000/1ms"

func BenchmarkBare(b *testing.B) {
	benchmarkClient(b, func(base http.RoundTripper) http.RoundTripper { return base })
}

func BenchmarkMemoryStore(b *testing.B) {
	thr := benchThrottler(b)
	benchmarkClient(b, func(base http.RoundTripper) http.RoundTripper { return transport.New(base, thr) })
}

func BenchmarkRedisStore(b *testing.B) {
	srv := redistest.StartServer(b)
	store, err := throttle.NewRedisStore(srv.Client(b), throttle.WithKeyPrefix(redistest.KeyPrefix(b)))
	if err != nil {
		b.Fatal(err)
	}
	thr := benchThrottler(b, throttle.WithStore(store))
	benchmarkClient(b, func(base http.RoundTripper) http.RoundTripper { return transport.New(base, thr) })
}

func benchThrottler(b *testing.B, opts ...throttle.Option) *throttle.Throttler {
	rules, err := throttle.ParseRules(benchRule)
	if err != nil {
		b.Fatal(err)
	}
	thr, err := throttle.New(rules, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = thr.Close() })
	return thr
}

// benchmarkClient runs GETs through wrap(base) one at a time ("serial":
// the latency a request pays) and from GOMAXPROCS goroutines ("parallel":
// throughput under contention for one target).
func benchmarkClient(b *testing.B, wrap func(http.RoundTripper) http.RoundTripper) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	b.Cleanup(srv.Close)
	base := &http.Transport{MaxIdleConnsPerHost: 256}
	b.Cleanup(base.CloseIdleConnections)
	client := &http.Client{Transport: wrap(base)}
	do := func(b *testing.B) {
		resp, err := client.Get(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			do(b)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				do(b)
			}
		})
	})
}

// stubBase answers every request at once with a canned 200, so
// BenchmarkOverhead measures only what the Transport itself costs.
type stubBase struct{}

func (stubBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// BenchmarkOverhead is the Transport's own cost per request under the limit
// on the memory store, with no network at all: compare it with
// BenchmarkOverhead/bare, the same request through the stub alone.
func BenchmarkOverhead(b *testing.B) {
	thr := benchThrottler(b)
	req, err := http.NewRequest(http.MethodGet, "http://example.com/", nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		rt   http.RoundTripper
	}{{"bare", stubBase{}}, {"memory", transport.New(stubBase{}, thr)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := c.rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				_ = resp.Body.Close()
			}
		})
	}
}
