package backoff_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/fleetgate/fleetgate/backoff"
)

func ExampleExponential() {
	// A seeded source makes the jittered schedule reproducible.
	e := backoff.Exponential{Base: time.Second, Max: 10 * time.Second, Rand: rand.New(rand.NewPCG(1, 2))}
	for retry := range 5 {
		fmt.Println(e.Delay(retry, 0).Round(time.Millisecond))
	}
	// Output:
	// 769ms
	// 1.233s
	// 3.138s
	// 6.373s
	// 2.343s
}

func ExampleExponential_noJitter() {
	e := backoff.Exponential{Base: time.Second, Max: 10 * time.Second, Jitter: backoff.NoJitter}
	for retry := range 5 {
		fmt.Println(e.Delay(retry, 0))
	}
	// Output:
	// 1s
	// 2s
	// 4s
	// 8s
	// 10s
}

func ExampleParseRetryAfter() {
	now := time.Date(1994, time.November, 6, 8, 49, 0, 0, time.UTC)
	for _, v := range []string{"120", "Sun, 06 Nov 1994 08:49:37 GMT", "3600", "1.5"} {
		d, err := backoff.ParseRetryAfter(v, now, 0)
		fmt.Println(d, err)
	}
	// Output:
	// 2m0s <nil>
	// 37s <nil>
	// 5m0s <nil>
	// 0s backoff: invalid Retry-After "1.5": neither delta-seconds nor an HTTP-date
}

func ExampleParseRateLimit() {
	h := http.Header{}
	h.Set("RateLimit", `"default";r=0;t=30`)
	h.Set("RateLimit-Policy", `"default";q=100;w=60`)
	hint, ok := backoff.ParseRateLimit(h, time.Now(), 0)
	fmt.Printf("%+v %v\n", hint, ok)
	// Output:
	// {Remaining:0 Reset:30s Limit:100 Window:1m0s} true
}

func ExampleRetryableHTTPBackoff() {
	var attempts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if attempts.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()

	client := retryablehttp.NewClient()
	client.Logger = nil
	client.Backoff = backoff.RetryableHTTPBackoff(&backoff.Exponential{}, time.Minute)
	client.CheckRetry = backoff.CheckRetry

	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.Status, "after", attempts.Load(), "attempts")
	// Output:
	// 200 OK after 2 attempts
}
