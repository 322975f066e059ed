package fakesite

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a settable clock for Site.now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) set(ms int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t0.Add(time.Duration(ms) * time.Millisecond)
}

func TestSiteDecisions(t *testing.T) {
	type hit struct {
		ms         int    // arrival, ms after t0
		addr       string // RemoteAddr
		status     int
		retryAfter string
	}
	const a, b = "10.0.0.1:1000", "10.0.0.2:2000"
	tests := []struct {
		name string
		cfg  Config
		hits []hit
		want Stats // Arrivals and Peak are checked separately
	}{
		{
			name: "no limit only counts",
			cfg:  Config{},
			hits: []hit{{0, a, 200, ""}, {0, a, 200, ""}, {0, a, 200, ""}},
			want: Stats{Requests: 3, OK: 3},
		},
		{
			name: "429 without Retry-After",
			cfg:  Config{Limit: 2, Window: time.Second},
			hits: []hit{{0, a, 200, ""}, {500, a, 200, ""}, {1000, a, 429, ""}, {1400, a, 429, ""}, {2600, a, 200, ""}},
			want: Stats{Requests: 5, OK: 3, TooMany: 2},
		},
		{
			name: "refused requests count toward the limit",
			cfg:  Config{Limit: 1, Window: time.Second},
			hits: []hit{{0, a, 200, ""}, {900, a, 429, ""}, {1500, a, 429, ""}, {2501, a, 200, ""}},
			want: Stats{Requests: 4, OK: 2, TooMany: 2},
		},
		{
			name: "Retry-After in whole seconds rounded up",
			cfg:  Config{Limit: 1, Window: time.Second, RetryAfter: 1500 * time.Millisecond},
			hits: []hit{{0, a, 200, ""}, {10, a, 429, "2"}},
			want: Stats{Requests: 2, OK: 1, TooMany: 1},
		},
		{
			name: "limit is per client",
			cfg:  Config{Limit: 1, Window: time.Second},
			hits: []hit{{0, a, 200, ""}, {0, b, 200, ""}, {10, b, 429, ""}},
			want: Stats{Requests: 3, OK: 2, TooMany: 1},
		},
		{
			name: "ban lasts and is per client",
			cfg:  Config{Limit: 2, Window: time.Second, Ban: true, RetryAfter: time.Second},
			hits: []hit{{0, a, 200, ""}, {10, a, 200, ""}, {20, a, 403, ""}, {5000, a, 403, ""}, {5000, b, 200, ""}},
			want: Stats{Requests: 5, OK: 3, Banned: 2, Bans: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &fakeClock{}
			s := New(tt.cfg)
			s.now = clock.now
			for i, h := range tt.hits {
				clock.set(h.ms)
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.RemoteAddr = h.addr
				w := httptest.NewRecorder()
				s.ServeHTTP(w, r)
				require.Equal(t, h.status, w.Code, "hit %d at %dms", i, h.ms)
				require.Equal(t, h.retryAfter, w.Header().Get("Retry-After"), "hit %d", i)
			}
			got := s.Stats()
			require.Len(t, got.Arrivals, len(tt.hits))
			got.Arrivals, got.Peak = nil, 0
			require.Equal(t, tt.want, got)
		})
	}
}

func TestSiteBansOverHTTP(t *testing.T) {
	site := New(Config{Limit: 3, Window: time.Minute, Ban: true})
	srv := httptest.NewServer(site)
	defer srv.Close()

	var codes []int
	for range 6 {
		resp, err := http.Get(srv.URL + "/page")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		codes = append(codes, resp.StatusCode)
	}
	require.Equal(t, []int{200, 200, 200, 403, 403, 403}, codes)
	st := site.Stats()
	require.Equal(t, 6, st.Requests)
	require.Equal(t, 3, st.OK)
	require.Equal(t, 3, st.Banned)
	require.Equal(t, 1, st.Bans)
	require.Equal(t, 6, st.Peak)
	require.Len(t, st.Arrivals, 6)
}

func TestSiteHandler(t *testing.T) {
	site := New(Config{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
	})})
	w := httptest.NewRecorder()
	site.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusTeapot, w.Code)
	require.Equal(t, 1, site.Stats().OK)
}

func TestSiteConcurrent(t *testing.T) {
	const clients, each, limit = 8, 50, 100
	site := New(Config{Limit: limit, Window: time.Hour})
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range each {
				w := httptest.NewRecorder()
				site.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
				_ = site.Stats()
			}
		})
	}
	wg.Wait()
	st := site.Stats()
	require.Equal(t, clients*each, st.Requests)
	require.Equal(t, limit, st.OK)
	require.Equal(t, clients*each-limit, st.TooMany)
	require.Equal(t, clients*each, st.Peak)
}

func TestNewPanicsWithoutWindow(t *testing.T) {
	require.PanicsWithValue(t, "fakesite: a positive Limit needs a positive Window, got 0s", func() {
		New(Config{Limit: 1})
	})
}
