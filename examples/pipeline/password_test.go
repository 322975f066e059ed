package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// apiPassword is the password the tests put in -api: no message, log line
// or file may show it.
const apiPassword = "APISECRET"

// withPassword returns base, an http://HOST:PORT URL, with the user
// apiuser and apiPassword in it, or with apiPassword alone as the user (a
// token) when token is set, and the same URL as messages show it.
func withPassword(base string, token bool) (api, shown string) {
	host := strings.TrimPrefix(base, "http://")
	if token {
		return "http://" + apiPassword + "@" + host, "http://xxxxx@" + host
	}
	return "http://apiuser:" + apiPassword + "@" + host, "http://apiuser:xxxxx@" + host
}

// A password in -api, or a token as its user, shows in no reject, neither
// on stderr nor in the -rejects file, whatever failed: an answer other
// than 200, an answer that is not JSON, an API that cannot be reached. The
// reasons still name the user (not a token), the host and the request,
// the password or token shown as "xxxxx".
func TestTheAPIPasswordIsNeverShown(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/countries/XJ", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "not JSON\n")
	})
	mux.HandleFunc("GET /v1/countries/{code}", serveCountry) // QQ: 404
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + ln.Addr().String() // nothing listens there
	require.NoError(t, ln.Close())

	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	require.NoError(t, os.WriteFile(in, []byte("id,country_code\nR1,DE\nR2,QQ\nR3,XJ\n"), 0o600))

	tests := []struct {
		name    string
		base    string   // the API, without the password
		want    []string // reasons, in the order of the input's records; "" for enriched
		rejects int
	}{
		{"answers", srv.URL, []string{
			"",
			"GET %s/v1/countries/QQ: 404 Not Found",
			"GET %s/v1/countries/XJ: decode the answer: invalid character 'o' in literal null (expecting 'u')",
		}, 2},
		{"no connection", closed, []string{
			"GET %s/v1/countries/DE: ",
			"GET %s/v1/countries/QQ: ",
			"GET %s/v1/countries/XJ: ",
		}, 3},
	}
	for _, tc := range tests {
		for _, token := range []bool{false, true} {
			name := tc.name
			if token {
				name += "/token"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				api, shown := withPassword(tc.base, token)
				dir := t.TempDir()
				out, rej := filepath.Join(dir, "out.csv"), filepath.Join(dir, "rejects.csv")
				var stderr lockedBuffer
				code := cli(t.Context(), []string{"-api", api, "-rule", "100/1s", "-in", in, "-out", out, "-rejects", rej}, "", io.Discard, &stderr)
				require.Equal(t, 1, code, stderr.String())

				for name, text := range map[string]string{"stderr": stderr.String(), "-rejects": readFile(t, rej), "-out": readFile(t, out)} {
					require.NotContains(t, text, apiPassword, "%s shows the password", name)
				}

				rows := readCSV(t, rej)
				require.Len(t, rows, tc.rejects+1, "the header and the rejects")
				var reasons []string
				for _, row := range rows[1:] {
					reasons = append(reasons, row[3])
				}
				for i, want := range tc.want {
					if want == "" {
						continue
					}
					want = strings.ReplaceAll(want, "%s", shown)
					require.Contains(t, stderr.String(), "pipeline: line "+strconv.Itoa(i+2)+" rejected: "+want)
					require.True(t, hasPrefix(reasons, want), "a reason in -rejects starts with %q: %q", want, reasons)
				}
			})
		}
	}
}

// hasPrefix reports whether one of ss starts with prefix.
func hasPrefix(ss []string, prefix string) bool {
	for _, s := range ss {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// readFile returns the text of the file at path.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}
