package transport_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

// TestStalledBodyDoesNotHoldTheRetry: a 503 whose body stalls is discarded
// within a bounded time, and the retry goes out.
func TestStalledBodyDoesNotHoldTheRetry(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("partial"))
			w.(http.Flusher).Flush()
			select { // stall the rest of the body
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	rules, err := throttle.ParseRules("*=100/1s")
	require.NoError(t, err)
	thr, err := throttle.New(rules)
	require.NoError(t, err)
	defer thr.Close()
	client := &http.Client{Transport: transport.New(nil, thr, transport.WithRetries(2))}
	defer client.CloseIdleConnections()

	start := time.Now()
	resp, err := client.Get(srv.URL) // no deadline
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, int32(2), calls.Load())
}
