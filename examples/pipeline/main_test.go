package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The exit status tells a bad command line or configuration (2, before
// any call, with a message naming the flag) from records that were
// rejected or a run that was interrupted (1) and from a run where every
// record was written (0), as cmd/crawl-demo does.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	good, _ := writeInput(t, 3)
	bad := filepath.Join(t.TempDir(), "bad.csv")
	require.NoError(t, os.WriteFile(bad, []byte("id,country_code\nR1,DE\nR2,USA\n"), 0o600))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	tests := []struct {
		name     string
		ctx      context.Context // nil: the test's
		args     []string
		redisURL string
		code     int
		stderr   string // in the standard error
	}{
		{"all written", nil, []string{"-in", good}, "", 0, "3 records: 3 enriched, 0 rejected"},
		{"help", nil, []string{"-h"}, "", 0, "Exit status: 0 when every record was enriched"},
		{"some rejected", nil, []string{"-in", bad}, "", 1, "1 of 2 records rejected"},
		{"interrupted", cancelled, []string{"-in", good}, "", 1, "context canceled"},
		{"zero API timeout", nil, []string{"-in", good, "-api-timeout", "0s"}, "", 2, "pipeline: -api-timeout 0s: want more than 0\nRun pipeline -h for the flags."},
		{"negative API timeout", nil, []string{"-in", good, "-api-timeout", "-5s"}, "", 2, "-api-timeout -5s: want more than 0"},
		{"API timeout not a duration", nil, []string{"-in", good, "-api-timeout", "soon"}, "", 2, `invalid value "soon" for flag -api-timeout`},
		{"unknown flag", nil, []string{"-in", good, "-bogus"}, "", 2, "pipeline: flag provided but not defined: -bogus\nRun pipeline -h for the flags.\n"},
		{"extra argument", nil, []string{"-in", good, "more"}, "", 2, "pipeline: unexpected argument \"more\": flags only (the input is the file -in names)\nRun pipeline -h for the flags.\n"},
		{"extra arguments", nil, []string{"-in", good, "more", "again"}, "", 2, "pipeline: unexpected argument \"more\": flags only (the input is the file -in names)\nRun pipeline -h for the flags.\n"},
		{"bad rule", nil, []string{"-in", good, "-rule", "10/m"}, "", 2, "-rule: bad rule"},
		{"no workers", nil, []string{"-in", good, "-workers", "0"}, "", 2, "-workers 0: want at least 1"},
		{"missing input", nil, []string{"-in", filepath.Join(t.TempDir(), "missing.csv")}, "", 2, "-in: open "},
		{"bad REDIS_URL", nil, []string{"-in", good}, "redis://127.0.0.1:x/0", 2, "REDIS_URL: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := tc.ctx
			if ctx == nil {
				ctx = t.Context()
			}
			var stdout bytes.Buffer
			var stderr lockedBuffer
			args := append([]string{"-api", api.URL, "-rule", "100/1s", "-out", filepath.Join(t.TempDir(), "out.csv")}, tc.args...)
			code := cli(ctx, args, tc.redisURL, &stdout, &stderr)
			require.Equal(t, tc.code, code, stderr.String())
			require.Contains(t, stderr.String(), tc.stderr)
			require.Empty(t, stdout.String())
			if tc.code == 2 { // one line naming the problem, and the hint, as cmd/crawl-demo does
				require.Equal(t, 2, strings.Count(stderr.String(), "\n"), stderr.String())
				require.True(t, strings.HasSuffix(stderr.String(), "\nRun pipeline -h for the flags.\n"), stderr.String())
				require.NotContains(t, stderr.String(), "Usage:", "the whole usage is for -h")
			}
		})
	}
}
