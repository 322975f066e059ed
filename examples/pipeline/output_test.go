package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An -out or -rejects that cannot be created is a configuration error,
// found before any API call, with a message naming the flag; an earlier
// file is left as it was and no temporary file is left behind.
func TestAnOutputThatCannotBeCreatedCostsNoCall(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.csv")
	require.NoError(t, os.WriteFile(bad, []byte("id,country_code\nR1,DE\nR2,USA\n"), 0o600))
	missing := filepath.Join(t.TempDir(), "missing", "x.csv")
	tests := []struct {
		name     string
		args     []string
		redisURL string
		stderr   string
	}{
		{"-out in a missing directory", []string{"-out", missing}, "", "pipeline: -out: create " + missing + ": no such file or directory"},
		{"-rejects in a missing directory", []string{"-rejects", missing}, "", "pipeline: -rejects: create " + missing + ": no such file or directory"},
		{"-out is a directory", []string{"-out", t.TempDir()}, "", "is a directory, want a file"},
		{"a bad REDIS_URL after the outputs", nil, "redis://127.0.0.1:x/0", "REDIS_URL: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api := startTestAPI(t, 100, time.Second)
			dir := t.TempDir()
			out, rej := filepath.Join(dir, "out.csv"), filepath.Join(dir, "rejects.csv")
			require.NoError(t, os.WriteFile(out, []byte("an earlier run's output\n"), 0o600))
			var stdout bytes.Buffer
			var stderr lockedBuffer
			args := append([]string{"-api", api.URL, "-rule", "100/1s", "-in", bad, "-out", out, "-rejects", rej}, tc.args...)
			code := cli(t.Context(), args, tc.redisURL, &stdout, &stderr)
			require.Equal(t, 2, code, stderr.String())
			require.Contains(t, stderr.String(), tc.stderr)
			require.Zero(t, api.Site.Stats().Requests, "API calls")
			require.Empty(t, stdout.String())
			requireOnlyEarlierOutput(t, dir, out)
		})
	}
}

// A file that cannot be written at the end (its directory was removed
// during the run) does not stop the other file, nor the report of every
// rejected record and the summary; the run exits 1 and says why.
func TestRejectsAreReportedWhenAnOutputCannotBeWritten(t *testing.T) {
	t.Parallel()
	outDir := t.TempDir()
	var once sync.Once
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/countries/{code}", func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() {
			if err := os.RemoveAll(outDir); err != nil {
				t.Error(err)
			}
		})
		serveCountry(w, r)
	})
	api := httptest.NewServer(mux)
	t.Cleanup(api.Close)
	in := filepath.Join(t.TempDir(), "in.csv")
	require.NoError(t, os.WriteFile(in, []byte("id,country_code\nR1,DE\nR2,USA\n"), 0o600))
	out, rej := filepath.Join(outDir, "out.csv"), filepath.Join(t.TempDir(), "rejects.csv")
	var stdout bytes.Buffer
	var stderr lockedBuffer

	code := cli(t.Context(), []string{"-api", api.URL, "-rule", "100/1s", "-in", in, "-out", out, "-rejects", rej}, "", &stdout, &stderr)
	require.Equal(t, 1, code, stderr.String())
	require.Contains(t, stderr.String(), "pipeline: line 3 rejected: country_code \"USA\"")
	require.Contains(t, stderr.String(), "pipeline: 2 records: 1 enriched, 1 rejected;")
	require.Contains(t, stderr.String(), "pipeline: -out: write "+out+": ")
	require.Contains(t, stderr.String(), "\npipeline: 1 of 2 records rejected, each reported above\n")
	require.Len(t, readCSV(t, rej), 2, "the header and the reject")
	require.Empty(t, stdout.String())
}

// An earlier -out is replaced only once the new one is complete: an
// interrupted run leaves it, and nothing else, in its directory.
func TestAnInterruptedRunLeavesTheEarlierOutput(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	in, _ := writeInput(t, 3)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.csv")
	require.NoError(t, os.WriteFile(out, []byte("an earlier run's output\n"), 0o600))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var stderr lockedBuffer
	code := cli(ctx, []string{"-api", api.URL, "-rule", "100/1s", "-in", in, "-out", out}, "", io.Discard, &stderr)
	require.Equal(t, 1, code, stderr.String())
	requireOnlyEarlierOutput(t, dir, out)

	require.Equal(t, 0, cli(t.Context(), []string{"-api", api.URL, "-rule", "100/1s", "-in", in, "-out", out}, "", io.Discard, &stderr), stderr.String())
	require.Len(t, readCSV(t, out), 4, "replaced: the header and 3 records")
	info, err := os.Stat(out)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the earlier file's permissions")
}

// requireOnlyEarlierOutput fails the test unless dir holds out alone, as an
// earlier run wrote it: no temporary file is left beside it.
func requireOnlyEarlierOutput(t *testing.T, dir, out string) {
	t.Helper()
	kept, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, "an earlier run's output\n", string(kept))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the earlier output, no temporary file: %v", entries)
}
