package main

import (
	"context"
	"io"
	"log/slog"
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
// a second host of a quota a worker waits on does not take the other
// worker while another quota's URL waits; by -key ip each host counts
// apart.
func TestHostsOfOneQuotaShareOneHostsWorkers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		key  string
		want []string // the URLs two workers take first
	}{
		{"domain", []string{"a.example.com", "other.test"}},
		{"host", []string{"a.example.com", "b.example.com"}},
		{"ip", []string{"a.example.com", "b.example.com"}},
	} {
		t.Run(tc.key, func(t *testing.T) {
			cfg, err := parseFlags([]string{"-urls", "-", "-key", tc.key, "-default", "1/1s"}, io.Discard)
			require.NoError(t, err)
			rules, err := cfg.throttleRules()
			require.NoError(t, err)
			thr, closeThr, err := newThrottler(cfg, rules, nil, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			defer closeThr()
			group := quotaOf(ctx, cfg, thr)
			q := newHostQueue(2, 10) // a share of one worker
			for _, host := range []string{"a.example.com", "b.example.com", "other.test"} {
				require.True(t, q.put(ctx, job{url: host, host: group(host)}))
			}
			var took []string
			for range 2 {
				j, ok := q.take(ctx)
				require.True(t, ok)
				took = append(took, j.url)
			}
			require.Equal(t, tc.want, took)
		})
	}
}
