package backoff_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/backoff"
)

// now is the fixed clock of the parser tests.
var now = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

const rfc850 = "Monday, 02-Jan-06 15:04:05 GMT"

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		maxWait time.Duration
		want    time.Duration
	}{
		{"delta seconds", "120", 0, 2 * time.Minute},
		{"spaces trimmed", " 120 ", 0, 2 * time.Minute},
		{"tabs trimmed", "\t120\t", 0, 2 * time.Minute},
		{"zero", "0", 0, 0},
		{"leading zeros", "000120", 0, 2 * time.Minute},
		{"capped at default", "600", 0, backoff.DefaultMaxRetryAfter},
		{"negative cap means default", "600", -time.Second, backoff.DefaultMaxRetryAfter},
		{"custom cap", "600", time.Minute, time.Minute},
		{"under custom cap", "600", time.Hour, 10 * time.Minute},
		{"largest duration capped", "9223372036", 0, backoff.DefaultMaxRetryAfter},
		{"overflows a duration: the longest wait", "9223372037", 0, backoff.DefaultMaxRetryAfter},
		{"overflows int64: the longest wait", "99999999999999999999999", time.Minute, time.Minute},
		{"IMF-fixdate past", "Sun, 06 Nov 1994 08:49:37 GMT", 0, 0},
		{"RFC 850 past", "Sunday, 06-Nov-94 08:49:37 GMT", 0, 0},
		{"asctime past", "Sun Nov  6 08:49:37 1994", 0, 0},
		{"asctime two-digit day", "Wed Nov 16 08:49:37 1994", 0, 0},
		{"asctime zero-padded day", "Sun Nov 06 08:49:37 1994", 0, 0},
		{"asctime zero-padded day, future", "Sat Nov 06 08:49:37 2094", 0, backoff.DefaultMaxRetryAfter},
		{"IMF-fixdate future", now.Add(90 * time.Second).Format(http.TimeFormat), 0, 90 * time.Second},
		{"RFC 850 future", now.Add(90 * time.Second).Format(rfc850), 0, 90 * time.Second},
		{"asctime future", now.Add(90 * time.Second).Format(time.ANSIC), 0, 90 * time.Second},
		{"date now", now.Format(http.TimeFormat), 0, 0},
		{"future date capped", "Sat, 06 Nov 2094 08:49:37 GMT", 0, backoff.DefaultMaxRetryAfter},
		{"future date custom cap", now.Add(time.Hour).Format(http.TimeFormat), 10 * time.Minute, 10 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := backoff.ParseRetryAfter(tt.value, now, tt.maxWait)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseRetryAfterInvalid(t *testing.T) {
	tests := []struct {
		name, value, wantErr string
	}{
		{"empty", "", `backoff: invalid Retry-After "": empty`},
		{"whitespace only", " \t ", `backoff: invalid Retry-After " \t ": empty`},
		{"negative", "-1", `backoff: invalid Retry-After "-1": neither delta-seconds nor an HTTP-date`},
		{"plus sign", "+5", `backoff: invalid Retry-After "+5": neither delta-seconds nor an HTTP-date`},
		{"fraction", "1.5", `backoff: invalid Retry-After "1.5": neither delta-seconds nor an HTTP-date`},
		{"garbage", "abc", `backoff: invalid Retry-After "abc": neither delta-seconds nor an HTTP-date`},
		{"unit", "120s", `backoff: invalid Retry-After "120s": neither delta-seconds nor an HTTP-date`},
		{"inner space", "1 20", `backoff: invalid Retry-After "1 20": neither delta-seconds nor an HTTP-date`},
		{"hex", "0x10", `backoff: invalid Retry-After "0x10": neither delta-seconds nor an HTTP-date`},
		{"underscore", "1_000", `backoff: invalid Retry-After "1_000": neither delta-seconds nor an HTTP-date`},
		{"IMF-fixdate not GMT", "Sun, 06 Nov 1994 08:49:37 UTC", `backoff: invalid Retry-After "Sun, 06 Nov 1994 08:49:37 UTC": neither delta-seconds nor an HTTP-date`},
		{"RFC 850 not GMT", "Sunday, 06-Nov-94 08:49:37 PST", `backoff: invalid Retry-After "Sunday, 06-Nov-94 08:49:37 PST": neither delta-seconds nor an HTTP-date`},
		{"date with trailing text", "Sun, 06 Nov 1994 08:49:37 GMT x", `backoff: invalid Retry-After "Sun, 06 Nov 1994 08:49:37 GMT x": neither delta-seconds nor an HTTP-date`},
		{"fractional seconds", "Sun, 06 Nov 1994 08:49:37.5 GMT", `backoff: invalid Retry-After "Sun, 06 Nov 1994 08:49:37.5 GMT": neither delta-seconds nor an HTTP-date`},
		{"one-digit hour", "Sun, 06 Nov 1994 8:49:37 GMT", `backoff: invalid Retry-After "Sun, 06 Nov 1994 8:49:37 GMT": neither delta-seconds nor an HTTP-date`},
		{"wrong weekday", "Mon, 06 Nov 1994 08:49:37 GMT", `backoff: invalid Retry-After "Mon, 06 Nov 1994 08:49:37 GMT": neither delta-seconds nor an HTTP-date`},
		{"lower-case month", "Sun, 06 nov 1994 08:49:37 GMT", `backoff: invalid Retry-After "Sun, 06 nov 1994 08:49:37 GMT": neither delta-seconds nor an HTTP-date`},
		{"ISO 8601", "1994-11-06T08:49:37Z", `backoff: invalid Retry-After "1994-11-06T08:49:37Z": neither delta-seconds nor an HTTP-date`},
		{"control bytes escaped", "1\x00\n", `backoff: invalid Retry-After "1\x00\n": neither delta-seconds nor an HTTP-date`},
		{"long value truncated", strings.Repeat("a", 100), `backoff: invalid Retry-After "` + strings.Repeat("a", 32) + `"...: neither delta-seconds nor an HTTP-date`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := backoff.ParseRetryAfter(tt.value, now, 0)
			require.ErrorIs(t, err, backoff.ErrInvalidRetryAfter)
			require.Equal(t, tt.wantErr, err.Error())
			require.Equal(t, time.Duration(0), got)
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, v := range []string{
		"120", " 120 ", "0", "-1", "+5", "1.5", "", "abc", "99999999999999999999999", "9223372036",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
		now.Add(time.Hour).Format(http.TimeFormat),
	} {
		f.Add(v, int64(0))
	}
	f.Add("600", int64(time.Minute))
	f.Add("Sat, 06 Nov 2094 08:49:37 GMT", int64(-1))
	f.Fuzz(func(t *testing.T, value string, maxWait int64) {
		limit := time.Duration(maxWait)
		if limit <= 0 {
			limit = backoff.DefaultMaxRetryAfter
		}
		got, err := backoff.ParseRetryAfter(value, now, time.Duration(maxWait))
		if got < 0 || got > limit {
			t.Fatalf("ParseRetryAfter(%q, %v) = %v, outside [0, %v]", value, maxWait, got, limit)
		}
		if err != nil {
			if !errors.Is(err, backoff.ErrInvalidRetryAfter) || got != 0 {
				t.Fatalf("ParseRetryAfter(%q) = %v, %v; want 0 and ErrInvalidRetryAfter", value, got, err)
			}
			return
		}
		// Nothing is guessed: an accepted value is digits or an HTTP-date.
		v := strings.Trim(value, " \t")
		if strings.Trim(v, "0123456789") != "" {
			if _, perr := http.ParseTime(v); perr != nil {
				t.Fatalf("ParseRetryAfter(%q) accepted a value http.ParseTime rejects: %v", value, perr)
			}
		}
	})
}

func TestResponseDate(t *testing.T) {
	server := now.Add(-5 * time.Second).Truncate(time.Second)
	h := http.Header{}
	require.Equal(t, now, backoff.ResponseDate(h, now), "no Date: the local clock")
	h.Set("Date", "yesterday")
	require.Equal(t, now, backoff.ResponseDate(h, now), "an unreadable Date: the local clock")
	h.Set("Date", server.UTC().Format(http.TimeFormat))
	require.True(t, server.Equal(backoff.ResponseDate(h, now)), "the server's clock")

	// A Retry-After date read against the server's clock asks for the wait
	// the server meant, whatever the local clock says.
	d, err := backoff.ParseRetryAfter(server.Add(7*time.Second).UTC().Format(http.TimeFormat), backoff.ResponseDate(h, now), 0)
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, d)
}

func TestParseRetryAfterField(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	inTen := now.Add(10 * time.Second).Format(http.TimeFormat)
	for _, tt := range []struct {
		lines []string
		want  time.Duration
		bad   bool
	}{
		{lines: []string{"5"}, want: 5 * time.Second},
		{lines: []string{"1", "100"}, want: 100 * time.Second},
		{lines: []string{"100", "1"}, want: 100 * time.Second},
		{lines: []string{inTen, "3"}, want: 10 * time.Second},
		{lines: []string{"1", "soon"}, bad: true},
		{lines: []string{"2, 3"}, bad: true},
		{lines: nil, bad: true},
	} {
		got, err := backoff.ParseRetryAfterField(tt.lines, now, 5*time.Minute)
		if tt.bad {
			require.ErrorIs(t, err, backoff.ErrInvalidRetryAfter, "%q", tt.lines)
			continue
		}
		require.NoError(t, err, "%q", tt.lines)
		require.Equal(t, tt.want, got, "%q", tt.lines)
	}
}
