package backoff_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
)

func TestRetryableHTTPBackoff(t *testing.T) {
	respond := func(status int, retryAfter string) *http.Response {
		resp := &http.Response{StatusCode: status, Header: make(http.Header)}
		if retryAfter != "" {
			resp.Header.Set("Retry-After", retryAfter)
		}
		return resp
	}
	fixed := &backoff.Exponential{Base: time.Second, Jitter: backoff.NoJitter}
	tests := []struct {
		name    string
		p       *backoff.Exponential
		attempt int
		resp    *http.Response
		want    time.Duration
	}{
		{"429 Retry-After", fixed, 0, respond(429, "7"), 7 * time.Second},
		{"503 Retry-After", fixed, 0, respond(503, "7"), 7 * time.Second},
		{"Retry-After 0", fixed, 3, respond(429, "0"), 0},
		{"Retry-After capped", fixed, 0, respond(429, "3600"), time.Minute},
		{"Retry-After ignored on 502", fixed, 2, respond(502, "7"), 4 * time.Second},
		{"invalid Retry-After", fixed, 1, respond(429, "soon"), 2 * time.Second},
		{"no Retry-After", fixed, 3, respond(503, ""), 8 * time.Second},
		{"no response", fixed, 0, nil, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := backoff.RetryableHTTPBackoff(tt.p, time.Minute)
			require.Equal(t, tt.want, b(time.Hour, time.Hour, tt.attempt, tt.resp))
		})
	}
}

func TestRetryableHTTPBackoffJitter(t *testing.T) {
	tests := []struct {
		name    string
		p       *backoff.Exponential
		attempt int
		lo, hi  time.Duration
	}{
		{"nil is the zero Exponential", nil, 3, 0, 800 * time.Millisecond},
		{"decorrelated first", &backoff.Exponential{Jitter: backoff.DecorrelatedJitter}, 0, 100 * time.Millisecond, 300 * time.Millisecond},
		{"decorrelated from the previous ceiling", &backoff.Exponential{Jitter: backoff.DecorrelatedJitter}, 3, 100 * time.Millisecond, 1200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := backoff.RetryableHTTPBackoff(tt.p, 0)
			for range 1000 {
				d := b(0, 0, tt.attempt, nil)
				require.GreaterOrEqual(t, d, tt.lo)
				require.LessOrEqual(t, d, tt.hi)
			}
		})
	}
}

func TestCheckRetry(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	retry, err := backoff.CheckRetry(canceled, &http.Response{StatusCode: 503}, nil)
	require.False(t, retry)
	require.ErrorIs(t, err, context.Canceled)

	for status, want := range map[int]bool{200: false, 404: false, 429: true, 503: true} {
		retry, err := backoff.CheckRetry(context.Background(), &http.Response{StatusCode: status}, nil)
		require.NoError(t, err)
		require.Equal(t, want, retry, "status %d", status)
	}
}

// TestRetryableHTTPClient runs both adapters in a retryablehttp.Client
// against a server that is unavailable twice.
func TestRetryableHTTPClient(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	client := retryablehttp.NewClient()
	client.Logger = nil
	client.Backoff = backoff.RetryableHTTPBackoff(&backoff.Exponential{Base: time.Millisecond}, time.Second)
	client.CheckRetry = backoff.CheckRetry

	t.Run("GET is retried", func(t *testing.T) {
		calls.Store(0)
		resp, err := client.Get(srv.URL)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, int32(3), calls.Load())
	})
	t.Run("POST is not retried", func(t *testing.T) {
		calls.Store(0)
		resp, err := client.Post(srv.URL, "text/plain", nil)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, int32(1), calls.Load())
	})
}
