package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// outcome is what one run() returned and wrote.
type outcome struct {
	code           int
	stdout, stderr string
}

// runCmd runs the command with args and stdin, as main would.
func runCmd(ctx context.Context, t *testing.T, stdin string, args ...string) outcome {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, strings.NewReader(stdin), &stdout, &stderr)
	return outcome{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// countingServer returns a test server answering 200 to every path, and
// its request counter.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.WriteString(w, "ok\n")
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// writeFile writes lines to a new file in a temporary directory.
func writeFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "urls.txt")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return path
}

// decodeLines decodes JSON Lines output, checking that every line has
// exactly the keys url, status, attempts, error in that order.
func decodeLines(t *testing.T, out string) []result {
	t.Helper()
	var res []result
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" && len(res) == 0 && i == 0 && out == "" {
			break
		}
		dec := json.NewDecoder(strings.NewReader(line))
		tok, err := dec.Token()
		require.NoError(t, err, "line %d: %s", i+1, line)
		require.Equal(t, json.Delim('{'), tok, "line %d", i+1)
		var keys []string
		for dec.More() {
			k, err := dec.Token()
			require.NoError(t, err, "line %d", i+1)
			keys = append(keys, k.(string))
			var v any
			require.NoError(t, dec.Decode(&v), "line %d", i+1)
		}
		require.Equal(t, []string{"url", "status", "attempts", "error"}, keys, "line %d: %s", i+1, line)
		var r result
		dec = json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&r), "line %d", i+1)
		res = append(res, r)
	}
	return res
}
