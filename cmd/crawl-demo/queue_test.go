package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHostQueueSharesWorkersAmongHosts(t *testing.T) {
	ctx := context.Background()
	q := newHostQueue(4, 100) // a share of 2 workers per host
	for _, h := range []string{"a", "a", "a", "a", "b", "a"} {
		require.True(t, q.put(ctx, job{url: h, host: h}))
	}
	var took []string
	for range 4 {
		j, ok := q.take(ctx)
		require.True(t, ok)
		took = append(took, j.host)
	}
	require.Equal(t, []string{"a", "a", "b", "a"}, took, "b goes before a's third; then only a waits, and a takes more than its share")
	q.done(job{host: "a"})
	q.close()
	for range 2 {
		j, ok := q.take(ctx)
		require.True(t, ok)
		require.Equal(t, "a", j.host)
	}
	_, ok := q.take(ctx)
	require.False(t, ok, "closed and empty")

	// An ended context stops a take and a put that would wait; what was
	// put and not taken is drained.
	q = newHostQueue(1, 1)
	require.True(t, q.put(ctx, job{url: "x", host: "x"}))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.False(t, q.put(cctx, job{url: "y", host: "y"}), "no room")
	_, ok = q.take(cctx)
	require.False(t, ok)
	require.Equal(t, []job{{url: "x", host: "x"}}, q.drain())
}

// TestHostsOfOneQuotaShareOneHostsWorkers: hosts that group alike (one
// quota, by -key domain) count as one host when the workers share out, so
// a second host of a quota the first worker waits on does not take the
// other worker while another quota's URL waits.
func TestHostsOfOneQuotaShareOneHostsWorkers(t *testing.T) {
	in := strings.NewReader("http://a.example.com/1\nhttp://b.example.com/1\nhttp://other.test/1\n")
	group := func(host string) string {
		if strings.HasSuffix(host, ".example.com") {
			return "example.com"
		}
		return host
	}
	release := make(chan struct{})
	started := make(chan string, 3)
	get := func(ctx context.Context, u string) result {
		started <- u
		if strings.Contains(u, "example.com") {
			select {
			case <-release: // the quota's wait, until the other quota's URL has started
			case <-ctx.Done():
			}
		}
		return result{URL: u, Status: 200}
	}
	done := make(chan error, 1)
	go func() {
		_, err := crawl(context.Background(), in, 2, group, get, func(result) error { return nil })
		done <- err
	}()
	first, second := <-started, <-started
	require.Equal(t, "http://a.example.com/1", first)
	require.Equal(t, "http://other.test/1", second, "b.example.com counts with a.example.com: the other worker takes the other quota's URL")
	close(release)
	require.Equal(t, "http://b.example.com/1", <-started)
	require.NoError(t, <-done)
}
