package transport

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
)

// TestStreaksLapse: a run of 429s escalates while they come, ends at a 2xx,
// and lapses when none comes for lapse after its latest pause ended: the
// next 429 then starts a new run, and runs of targets not met again are
// dropped, so a crawler over many targets keeps only the recent ones.
func TestStreaksLapse(t *testing.T) {
	p := &backoff.Exponential{Base: time.Second, Max: time.Hour, Jitter: backoff.NoJitter}
	const lapse = 5 * time.Minute
	t0 := time.Unix(1_800_000_000, 0)
	var s streaks
	escalate := func(target string, at time.Time) time.Duration {
		t.Helper()
		d, ok := s.escalate(target, at, at, p, lapse)
		require.True(t, ok)
		return d
	}

	require.Equal(t, time.Second, escalate("a", t0))
	require.Equal(t, 2*time.Second, escalate("a", t0.Add(time.Minute)), "a 429 within the lapse escalates")
	_, ok := s.escalate("a", t0.Add(30*time.Second), t0.Add(2*time.Minute), p, lapse)
	require.False(t, ok, "a 429 to a request sent before the latest escalation says nothing new")
	at := t0.Add(time.Minute + 2*time.Second + lapse) // the latest pause's end, and the lapse
	require.Equal(t, 4*time.Second, escalate("a", at), "a 429 as the run lapses still escalates")
	require.Equal(t, time.Second, escalate("a", at.Add(4*time.Second+lapse+time.Nanosecond)), "a 429 after the run lapsed starts a new one")

	s.reset("a", t0.Add(time.Hour))
	require.False(t, s.active(), "a 2xx ends the run")

	// Many targets met once: their runs are dropped once lapsed, at the
	// first sweep after, which comes when the runs have doubled since the
	// last (at 1,024 here).
	for i := range 1000 {
		escalate(fmt.Sprintf("t%d", i), t0)
	}
	require.EqualValues(t, 1000, s.n.Load())
	later := t0.Add(time.Second + lapse + time.Nanosecond)
	for i := range 30 {
		escalate(fmt.Sprintf("u%d", i), later)
	}
	require.EqualValues(t, 30, s.n.Load(), "only the runs that have not lapsed are kept")
	require.Len(t, s.m, 30)
	for target := range s.m {
		require.Equal(t, byte('u'), target[0], "a lapsed run was kept: %s", target)
	}
}
