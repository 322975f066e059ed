package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/throttle"
)

// An API that never answers one code, and one that sends the headers of
// another and then never ends the body: each such call fails at
// -api-timeout four times (the first through the transport's retries, the
// second through lookup's, its answer having come), its record is
// rejected with a reason that names the flag, and the other records are
// still written.
func TestAHungCallIsRejectedAtTheTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{}) // the hung handlers return by the end of the test
	hang := func(r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/countries/XH", func(w http.ResponseWriter, r *http.Request) { hang(r) })
	mux.HandleFunc("GET /v1/countries/XB", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"code":"XB","name":"`)
		w.(http.Flusher).Flush()
		hang(r)
	})
	mux.HandleFunc("GET /v1/countries/{code}", serveCountry)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for the handlers

	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	require.NoError(t, os.WriteFile(in, []byte("id,country_code\nR1,DE\nR2,XH\nR3,XB\nR4,JP\n"), 0o600))
	out := filepath.Join(dir, "out.csv")
	var stderr lockedBuffer
	// Without a timeout the run would hang: ctx ends it, and the test fails.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()

	err := run(ctx, config{in: in, out: out, api: srv.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: 300 * time.Millisecond, workers: 4}, io.Discard, &stderr)
	require.EqualError(t, err, "2 of 4 records rejected, each reported above", stderr.String())
	require.Less(t, time.Since(start), 6*time.Second, "four attempts of 300ms and the delays between them")

	require.Equal(t, [][]string{
		{"id", "country_code", "country_name", "region"},
		{"R1", "DE", countries["DE"].Name, countries["DE"].Region},
		{"R4", "JP", countries["JP"].Name, countries["JP"].Region},
	}, readCSV(t, out))
	for _, want := range []string{
		"line 3 rejected: GET " + srv.URL + `/v1/countries/XH: no answer within -api-timeout 300ms: transport: attempt 4 to "` + strings.TrimPrefix(srv.URL, "http://") + `": context deadline exceeded`,
		"line 4 rejected: GET " + srv.URL + "/v1/countries/XB: the answer did not end within -api-timeout 300ms: context deadline exceeded",
		"pipeline: 4 records: 2 enriched, 2 rejected; 10 API calls, 0 answered 429",
	} {
		require.Contains(t, stderr.String(), want)
	}
}

// An answer whose body breaks off (cut short, or past -api-timeout) is
// asked for again: a record whose first answers break off is enriched by
// the next whole one.
func TestABrokenBodyIsAskedForAgain(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/countries/{code}", func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1: // cut short: the connection closes before the body it announced
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, `{"code":`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case 2: // past -api-timeout
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, `{"code":`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		serveCountry(w, r)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	in, records := writeInput(t, 1)
	out := filepath.Join(t.TempDir(), "out.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: out, api: srv.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: 300 * time.Millisecond, workers: 1}, io.Discard, &stderr)
	require.NoError(t, err, stderr.String())
	requireEnriched(t, records, readCSV(t, out))
	require.EqualValues(t, 3, calls.Load())
	require.Contains(t, stderr.String(), "pipeline: 1 records: 1 enriched, 0 rejected; 3 API calls")
}

// A record costs at most 4 requests in all, whether the transport or
// lookup makes them again: after a body cut short, the transport's own
// retries of 503s get the attempts left, not 4 more.
func TestARecordCostsAtMostFourRequests(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 { // cut short
			w.Header().Set("Content-Length", "100")
			_, _ = io.WriteString(w, `{"code":`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	in, _ := writeInput(t, 1)
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: filepath.Join(t.TempDir(), "out.csv"), api: srv.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: time.Second, workers: 1}, io.Discard, &stderr)
	require.EqualError(t, err, "1 of 1 records rejected, each reported above", stderr.String())
	require.EqualValues(t, 4, calls.Load())
	require.Contains(t, stderr.String(), "503 Service Unavailable")
}

// The timeout bounds each attempt from the moment the quota lets it go:
// calls that wait on the quota far longer than -api-timeout still succeed.
func TestTheQuotaWaitIsNotPartOfTheTimeout(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	in, records := writeInput(t, 4)
	out := filepath.Join(t.TempDir(), "out.csv")
	var stderr lockedBuffer
	start := time.Now()

	// One call per 250ms plus the margin: the fourth waits about 900ms.
	err := run(t.Context(), config{in: in, out: out, api: api.URL, rule: "1/250ms", margin: throttle.DefaultMargin, timeout: 200 * time.Millisecond, workers: 4}, io.Discard, &stderr)
	require.NoError(t, err, stderr.String())
	require.Greater(t, time.Since(start), 800*time.Millisecond, "the quota's waits")
	requireEnriched(t, records, readCSV(t, out))
}

// An API that drops a kept-alive connection without answering makes
// net/http send the request again on a fresh connection, by itself: the
// summary's API calls count every request the API received, those too.
func TestAPICallsCountNetHTTPsOwnResends(t *testing.T) {
	t.Parallel()
	var received atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/countries/{code}", func(w http.ResponseWriter, r *http.Request) {
		if received.Add(1)%3 == 0 { // every third request: no answer, the connection closed
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		serveCountry(w, r)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	var b strings.Builder
	b.WriteString("id,country_code\n")
	for i := range 30 {
		fmt.Fprintf(&b, "R%d,DE\n", i)
	}
	require.NoError(t, os.WriteFile(in, []byte(b.String()), 0o600))
	var stderr lockedBuffer
	err := run(t.Context(), config{in: in, out: filepath.Join(dir, "out.csv"), api: srv.URL, rule: "1000/1s", margin: throttle.DefaultMargin, timeout: 5 * time.Second, workers: 2}, io.Discard, &stderr)
	require.NoError(t, err, stderr.String())
	require.Greater(t, received.Load(), int64(30), "some requests were sent again")
	require.Contains(t, stderr.String(), fmt.Sprintf("pipeline: 30 records: 30 enriched, 0 rejected; %d API calls, ", received.Load()))
}
