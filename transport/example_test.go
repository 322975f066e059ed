package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/fleetgate/fleetgate/backoff"
	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

// An http.Client whose requests wait for the quota, here kept in memory
// for one process; give the Throttler a RedisStore to share it with a
// fleet. The target's first answer is a 503, which is retried.
func Example() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "hello")
	}))
	defer srv.Close()

	rules, err := throttle.ParseRules("*=10/1s")
	if err != nil {
		panic(err)
	}
	t, err := throttle.New(rules)
	if err != nil {
		panic(err)
	}
	defer t.Close()

	client := &http.Client{Transport: transport.New(nil, t,
		transport.WithAttemptsHeader("X-Fleetgate-Attempts"),
		transport.OnAttempt(func(a transport.AttemptInfo) {
			fmt.Println("attempt", a.Attempt, "answered", a.Status)
		}),
	)}
	defer client.CloseIdleConnections()

	resp, err := client.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d after %s attempts: %s", resp.StatusCode, resp.Header.Get("X-Fleetgate-Attempts"), body)
	// Output:
	// attempt 1 answered 503
	// attempt 2 answered 200
	// 200 after 2 attempts: hello
}

// A 429 with Retry-After pauses the target for every process sharing the
// Throttler's store; requests that cannot wait that long fail at once,
// unsent.
func Example_tooManyRequests() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()

	rules, err := throttle.ParseRules("*=10/1s")
	if err != nil {
		panic(err)
	}
	t, err := throttle.New(rules)
	if err != nil {
		panic(err)
	}
	defer t.Close()
	client := &http.Client{Transport: transport.New(nil, t, transport.WithoutRetries())}
	defer client.CloseIdleConnections()

	resp, err := client.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	left, _ := t.Paused(context.Background(), srv.Listener.Addr().String())
	fmt.Println(resp.StatusCode, "paused for about", left.Round(time.Minute/2))

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	_, err = client.Do(req)
	fmt.Println(err != nil && ctx.Err() == nil) // failed before the deadline
	// Output:
	// 429 paused for about 30s
	// true
}

// Under github.com/hashicorp/go-retryablehttp, which retries itself, the
// Transport sends each of its attempts once, under the quota, and still
// turns every Retry-After into a fleet-wide pause. The backoff package
// gives retryablehttp the same rules the Transport would use.
func Example_retryablehttp() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		fmt.Fprintln(w, "hello")
	}))
	defer srv.Close()

	rules, err := throttle.ParseRules("*=10/1s")
	if err != nil {
		panic(err)
	}
	t, err := throttle.New(rules)
	if err != nil {
		panic(err)
	}
	defer t.Close()

	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: transport.New(nil, t, transport.WithoutRetries())}
	rc.Backoff = backoff.RetryableHTTPBackoff(&backoff.Exponential{Base: 10 * time.Millisecond}, 0)
	rc.CheckRetry = backoff.CheckRetry
	rc.RetryMax = 3
	rc.Logger = nil
	defer rc.HTTPClient.CloseIdleConnections()

	resp, err := rc.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d after %d requests: %s", resp.StatusCode, calls.Load(), body)
	// Output:
	// 200 after 2 requests: hello
}

// Each attempt bounded by its own timeout, which the wait on the quota does
// not count: the target hangs on the first request, whose attempt is cut
// after 100 ms and retried; the retry waits on the quota until 300 ms after
// the first (one request per 300 ms) and is answered. An
// http.Client.Timeout of 200 ms would have failed the request instead.
func ExampleWithAttemptTimeout() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-r.Context().Done() // hangs until the client gives up
			return
		}
		fmt.Fprintln(w, "hello")
	}))
	defer srv.Close()

	rules, err := throttle.ParseRules("*=1/300ms")
	if err != nil {
		panic(err)
	}
	t, err := throttle.New(rules, throttle.WithMargin(0))
	if err != nil {
		panic(err)
	}
	defer t.Close()

	client := &http.Client{Transport: transport.New(nil, t,
		transport.WithAttemptTimeout(100*time.Millisecond),
		transport.WithBackoff(&backoff.Exponential{Base: time.Millisecond, Max: time.Millisecond}),
		transport.OnAttempt(func(a transport.AttemptInfo) {
			fmt.Println("attempt", a.Attempt, "status", a.Status, "error", a.Err != nil)
		}),
	)}
	defer client.CloseIdleConnections()

	resp, err := client.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d: %s", resp.StatusCode, body)
	// Output:
	// attempt 1 status 0 error true
	// attempt 2 status 200 error false
	// 200: hello
}
