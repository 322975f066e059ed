package backoff_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
)

// header builds an http.Header from name, value pairs, adding repeated
// names as separate field lines.
func header(kv ...string) http.Header {
	h := make(http.Header)
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestParseRateLimit(t *testing.T) {
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	unknown := backoff.Hint{Remaining: -1}
	tests := []struct {
		name    string
		h       http.Header
		maxWait time.Duration
		want    backoff.Hint
		wantOK  bool
	}{
		{"no fields", header("Content-Type", "text/plain"), 0, unknown, false},
		{
			"X-RateLimit delta reset",
			header("X-RateLimit-Limit", "100", "X-RateLimit-Remaining", "50", "X-RateLimit-Reset", "30"),
			0, backoff.Hint{Remaining: 50, Reset: 30 * time.Second, Limit: 100}, true,
		},
		{
			"X-RateLimit epoch reset",
			header("X-RateLimit-Reset", epoch(30*time.Second)),
			0, backoff.Hint{Remaining: -1, Reset: 30 * time.Second}, true,
		},
		{"epoch in the past is 0", header("X-RateLimit-Reset", epoch(-30*time.Second)), 0, unknown, true},
		{"epoch a day in the past ignored", header("X-RateLimit-Reset", epoch(-48*time.Hour)), 0, unknown, false},
		{"epoch a day ahead ignored", header("X-RateLimit-Reset", epoch(48*time.Hour)), 0, unknown, false},
		{"epoch in milliseconds ignored", header("X-RateLimit-Reset", strconv.FormatInt(now.UnixMilli(), 10)), 0, unknown, false},
		{"delta over a day ignored", header("X-RateLimit-Reset", "86401"), 0, unknown, false},
		{"delta of a day capped", header("X-RateLimit-Reset", "86400"), 0, backoff.Hint{Remaining: -1, Reset: backoff.DefaultMaxRetryAfter}, true},
		{"custom cap", header("X-RateLimit-Reset", "600"), time.Minute, backoff.Hint{Remaining: -1, Reset: time.Minute}, true},
		{"negative cap means default", header("X-RateLimit-Reset", "600"), -1, backoff.Hint{Remaining: -1, Reset: backoff.DefaultMaxRetryAfter}, true},
		{
			"X-Rate-Limit spelling",
			header("X-Rate-Limit-Limit", "10", "X-Rate-Limit-Remaining", "0", "X-Rate-Limit-Reset", "5"),
			0, backoff.Hint{Remaining: 0, Reset: 5 * time.Second, Limit: 10}, true,
		},
		{
			"IETF structured",
			header("RateLimit", `"default";r=50;t=30`, "RateLimit-Policy", `"default";q=100;w=60`),
			0, backoff.Hint{Remaining: 50, Reset: 30 * time.Second, Limit: 100, Window: time.Minute}, true,
		},
		{
			"IETF structured with tokens and spaces",
			header("RateLimit", ` default ; r=50 ; t=30 `, "RateLimit-Policy", `default;q=100;w=60`),
			0, backoff.Hint{Remaining: 50, Reset: 30 * time.Second, Limit: 100, Window: time.Minute}, true,
		},
		{
			"IETF structured picks the fewest remaining",
			header("RateLimit", `"daily";r=900;t=3600, "burst";r=5;t=1`,
				"RateLimit-Policy", `"burst";q=10;w=1, "daily";q=1000;w=86400`),
			0, backoff.Hint{Remaining: 5, Reset: time.Second, Limit: 10, Window: time.Second}, true,
		},
		{
			"IETF structured over several field lines",
			header("RateLimit", `"daily";r=900;t=3600`, "RateLimit", `"burst";r=5;t=1`,
				"RateLimit-Policy", `"daily";q=1000;w=86400`, "RateLimit-Policy", `"burst";q=10;w=1`),
			0, backoff.Hint{Remaining: 5, Reset: time.Second, Limit: 10, Window: time.Second}, true,
		},
		{
			"IETF structured quoted comma",
			header("RateLimit", `"a,b;c";r=3;t=10`, "RateLimit-Policy", `"x";q=1, "a,b;c";q=10;w=60`),
			0, backoff.Hint{Remaining: 3, Reset: 10 * time.Second, Limit: 10, Window: time.Minute}, true,
		},
		{
			"IETF structured unknown policy",
			header("RateLimit", `"default";r=50;t=30`, "RateLimit-Policy", `"other";q=100;w=60`),
			0, backoff.Hint{Remaining: 50, Reset: 30 * time.Second}, true,
		},
		{
			"IETF dictionary",
			header("RateLimit", "limit=100, remaining=50, reset=30", "RateLimit-Policy", "100;w=60"),
			0, backoff.Hint{Remaining: 50, Reset: 30 * time.Second, Limit: 100, Window: time.Minute}, true,
		},
		{
			"IETF separate fields",
			header("RateLimit-Limit", "100", "RateLimit-Remaining", "50", "RateLimit-Reset", "30"),
			0, backoff.Hint{Remaining: 50, Reset: 30 * time.Second, Limit: 100}, true,
		},
		{
			"IETF separate fields with policy",
			header("RateLimit-Remaining", "50", "RateLimit-Reset", "30", "RateLimit-Policy", "100;w=60, 1000;w=3600"),
			0, backoff.Hint{Remaining: 50, Reset: 30 * time.Second, Limit: 100, Window: time.Minute}, true,
		},
		{
			"IETF wins over X-RateLimit",
			header("RateLimit", `"default";r=5;t=10`, "X-RateLimit-Remaining", "50", "X-RateLimit-Reset", "30"),
			0, backoff.Hint{Remaining: 5, Reset: 10 * time.Second}, true,
		},
		{
			"missing field falls back",
			header("RateLimit", `"default";r=5`, "X-RateLimit-Reset", "30", "X-RateLimit-Limit", "10"),
			0, backoff.Hint{Remaining: 5, Reset: 30 * time.Second, Limit: 10}, true,
		},
		{
			"malformed field falls back",
			header("RateLimit", `"default";r=-5;t=soon`, "X-RateLimit-Remaining", "7", "X-RateLimit-Reset", "3"),
			0, backoff.Hint{Remaining: 7, Reset: 3 * time.Second}, true,
		},
		{
			"absurd values ignored",
			header("X-RateLimit-Limit", "0", "X-RateLimit-Remaining", "99999999999999999999999",
				"X-RateLimit-Reset", "-30", "RateLimit-Policy", "100;w=2592000"),
			0, backoff.Hint{Remaining: -1, Limit: 100}, true,
		},
		{
			"garbage ignored",
			header("RateLimit", `;;=,,"`, "RateLimit-Policy", `"`, "X-RateLimit-Remaining", "1.5",
				"X-RateLimit-Reset", "+30", "X-RateLimit-Limit", "ten"),
			0, unknown, false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := backoff.ParseRateLimit(tt.h, now, tt.maxWait)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.wantOK, ok)
		})
	}
}

func FuzzParseRateLimit(f *testing.F) {
	f.Add(`"default";r=50;t=30`, `"default";q=100;w=60`, "", "", "", int64(0))
	f.Add("limit=100, remaining=50, reset=30", "100;w=60", "", "", "", int64(0))
	f.Add(`"a,b";r=1;t=2, "c";r=0;t=99999`, `"c";q=1;w=86400`, "", "", "", int64(time.Minute))
	f.Add("", "", "100", "50", "30", int64(0))
	f.Add("", "", "100", "0", strconv.FormatInt(now.Unix()+30, 10), int64(-1))
	f.Add("", "", "-1", "1.5", "99999999999999999999999", int64(0))
	f.Fuzz(func(t *testing.T, rateLimit, policy, limit, remaining, reset string, maxWait int64) {
		h := header(
			"RateLimit", rateLimit, "RateLimit-Policy", policy,
			"X-RateLimit-Limit", limit, "X-RateLimit-Remaining", remaining, "X-RateLimit-Reset", reset,
			"RateLimit-Reset", reset,
		)
		ceiling := time.Duration(maxWait)
		if ceiling <= 0 {
			ceiling = backoff.DefaultMaxRetryAfter
		}
		hint, ok := backoff.ParseRateLimit(h, now, time.Duration(maxWait))
		switch {
		case hint.Reset < 0 || hint.Reset > ceiling:
			t.Fatalf("Reset %v outside [0, %v]", hint.Reset, ceiling)
		case hint.Remaining < -1, hint.Limit < 0:
			t.Fatalf("negative count in %+v", hint)
		case hint.Window < 0 || hint.Window > 24*time.Hour:
			t.Fatalf("Window %v outside [0, 24h]", hint.Window)
		case !ok && hint != backoff.Hint{Remaining: -1}:
			t.Fatalf("not ok but %+v", hint)
		}
	})
}
