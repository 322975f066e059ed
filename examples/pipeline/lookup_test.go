package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/throttle"
)

// A 200 is a country only if it is a JSON object with a name and a
// region, in at most 1 MiB: every other answer rejects its record with a
// reason that says what was wrong with it, and the other records are
// still written.
func TestAnAnswerThatIsNotACountryIsRejected(t *testing.T) {
	t.Parallel()
	padded := func(n int) string { // a country of exactly n bytes
		c, err := json.Marshal(country{Code: "XP", Name: "Padland", Region: "Europe"})
		require.NoError(t, err)
		return string(c) + strings.Repeat(" ", n-len(c))
	}
	huge := `{"code":"XL","name":"` + strings.Repeat("x", 2<<20) + `","region":"Europe"}`
	tests := []struct {
		code string
		body string // answered with status 200
		want string // in the record's reason; "" when it is enriched
	}{
		{"XE", `{}`, `the answer is not a country: "name" and "region" are empty or missing`},
		{"XU", `null`, `the answer is not a country: "name" and "region" are empty or missing`},
		{"XN", `{"code":"XN","name":"","region":"Europe"}`, `the answer is not a country: "name" is empty or missing`},
		{"XR", `{"code":"XR","name":"Rland","region":"  "}`, `the answer is not a country: "region" is empty or missing`},
		{"XA", `[]`, "decode the answer: json: cannot unmarshal array"},
		{"XL", huge, fmt.Sprintf("the answer is over the 1 MiB limit (%d bytes)", len(huge))}, // with a Content-Length
		{"XC", huge, "the answer is over the 1 MiB limit"},                                    // chunked
		{"XP", padded(maxBody), ""},
	}
	mux := http.NewServeMux()
	for _, tc := range tests {
		mux.HandleFunc("GET /v1/countries/"+tc.code, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if tc.code == "XC" { // no Content-Length: the body must be read to learn its size
				for part := range slices.Chunk([]byte(tc.body), 64<<10) {
					if _, err := w.Write(part); err != nil {
						return
					}
					w.(http.Flusher).Flush()
				}
				return
			}
			w.Header().Set("Content-Length", fmt.Sprint(len(tc.body)))
			_, _ = io.WriteString(w, tc.body)
		})
	}
	mux.HandleFunc("GET /v1/countries/{code}", serveCountry)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	lines := []string{"id,country_code", "R0,DE"}
	for _, tc := range tests {
		lines = append(lines, "R-"+tc.code+","+tc.code)
	}
	require.NoError(t, os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	out := filepath.Join(dir, "out.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: out, api: srv.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 4}, io.Discard, &stderr)
	require.EqualError(t, err, fmt.Sprintf("%d of %d records rejected, each reported above", len(tests)-1, len(tests)+1), stderr.String())

	require.Equal(t, [][]string{
		{"id", "country_code", "country_name", "region"},
		{"R0", "DE", countries["DE"].Name, countries["DE"].Region},
		{"R-XP", "XP", "Padland", "Europe"},
	}, readCSV(t, out))
	for i, tc := range tests {
		if tc.want == "" {
			continue
		}
		t.Run(tc.code, func(t *testing.T) {
			want := fmt.Sprintf("pipeline: line %d rejected: GET %s/v1/countries/%s: %s", i+3, srv.URL, tc.code, tc.want)
			require.Contains(t, stderr.String(), want)
		})
	}
}

// An -api URL with a query (an API key, most often) keeps it on every
// call, after the call's own path (the base's escapes kept), and no
// message shows its value.
func TestTheAPIQueryGoesWithEveryCall(t *testing.T) {
	t.Parallel()
	var bad atomic.Int32 // calls without the key, or at another path
	mux := http.NewServeMux()
	mux.HandleFunc("GET /base/{tenant}/v1/countries/{code}", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("api_key") != "APISECRET" || r.PathValue("tenant") != "a/b" {
			bad.Add(1)
		}
		serveCountry(w, r)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		bad.Add(1)
		http.NotFound(w, r)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	require.NoError(t, os.WriteFile(in, []byte("id,country_code\nR1,DE\nR2,ZZ\nR3,JP\n"), 0o600))
	out := filepath.Join(dir, "out.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: out, api: srv.URL + "/base/a%2Fb/?api_key=APISECRET", rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}, io.Discard, &stderr)
	require.EqualError(t, err, "1 of 3 records rejected, each reported above", stderr.String())
	require.Zero(t, bad.Load(), "calls without the key or at another path")
	require.Equal(t, [][]string{
		{"id", "country_code", "country_name", "region"},
		{"R1", "DE", countries["DE"].Name, countries["DE"].Region},
		{"R3", "JP", countries["JP"].Name, countries["JP"].Region},
	}, readCSV(t, out))
	require.Contains(t, stderr.String(), "line 3 rejected: GET "+srv.URL+"/base/a%2Fb/v1/countries/ZZ?api_key=xxxxx: 404 Not Found")
	require.NotContains(t, stderr.String(), "APISECRET")
}
