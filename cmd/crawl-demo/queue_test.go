package main

import (
	"context"
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
