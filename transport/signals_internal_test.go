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
		s.heldFrom(target, at) // the pause in place at once
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

// TestStreaksHoldFromThePause: a 429 escalates the run, and its pause
// takes a store call to be in place. Answers that come meanwhile, and
// answers to requests sent before the pause was in place, are of the same
// burst: a 429 escalates nothing (a burst escalated two or three times so)
// and a 2xx ends nothing. A 429 to a request sent once the pause was in
// place escalates again.
func TestStreaksHoldFromThePause(t *testing.T) {
	p := &backoff.Exponential{Base: time.Second, Max: time.Hour, Jitter: backoff.NoJitter}
	const lapse = 5 * time.Minute
	t0 := time.Unix(1_800_000_000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	var s streaks

	d, ok := s.escalate("a", t0, t0, p, lapse)
	require.True(t, ok)
	require.Equal(t, time.Second, d)
	// While the pause is on its way to the store:
	_, ok = s.escalate("a", ms(1), ms(2), p, lapse)
	require.False(t, ok, "a 429 answered before the pause was in place")
	s.reset("a", ms(1))
	require.True(t, s.active(), "a 2xx answered before the pause was in place ends nothing")
	s.heldFrom("a", ms(3)) // in place 3 ms after the 429
	_, ok = s.escalate("a", ms(2), ms(4), p, lapse)
	require.False(t, ok, "a 429 to a request sent before the pause was in place")
	s.reset("a", ms(2))
	require.True(t, s.active(), "a 2xx to a request sent before the pause was in place ends nothing")

	d, ok = s.escalate("a", ms(3), ms(5), p, lapse)
	require.True(t, ok, "a 429 to a request sent once the pause was in place")
	require.Equal(t, 2*time.Second, d)
	s.heldFrom("a", ms(6))
	s.heldFrom("a", ms(9)) // the pause was in place already: changes nothing
	_, ok = s.escalate("a", ms(6), ms(10), p, lapse)
	require.True(t, ok, "sent once the second pause was in place")
	s.heldFrom("b", ms(9)) // no run: nothing to hold
	require.EqualValues(t, 1, s.n.Load())
}
