package main

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/internal/fakesite"
)

// The limit of the fake API that run starts when no -api is given: 20
// requests per second per client, answered 429 with "Retry-After: 1" past
// it. The default -rule matches it; the throttle adds its margin.
const (
	fakeAPILimit  = 20
	fakeAPIWindow = time.Second
)

// country is the enrichment the API returns for one ISO 3166-1 alpha-2
// code, as JSON.
type country struct {
	Code   string `json:"code"`
	Name   string `json:"name"`
	Region string `json:"region"`
}

// countries is the fake API's whole database, by code.
var countries = map[string]country{
	"AR": {Name: "Argentina", Region: "Americas"},
	"AT": {Name: "Austria", Region: "Europe"},
	"AU": {Name: "Australia", Region: "Oceania"},
	"BE": {Name: "Belgium", Region: "Europe"},
	"BR": {Name: "Brazil", Region: "Americas"},
	"CA": {Name: "Canada", Region: "Americas"},
	"CH": {Name: "Switzerland", Region: "Europe"},
	"CL": {Name: "Chile", Region: "Americas"},
	"CN": {Name: "China", Region: "Asia"},
	"CZ": {Name: "Czechia", Region: "Europe"},
	"DE": {Name: "Germany", Region: "Europe"},
	"DK": {Name: "Denmark", Region: "Europe"},
	"EG": {Name: "Egypt", Region: "Africa"},
	"ES": {Name: "Spain", Region: "Europe"},
	"FI": {Name: "Finland", Region: "Europe"},
	"FR": {Name: "France", Region: "Europe"},
	"GB": {Name: "United Kingdom", Region: "Europe"},
	"GH": {Name: "Ghana", Region: "Africa"},
	"ID": {Name: "Indonesia", Region: "Asia"},
	"IE": {Name: "Ireland", Region: "Europe"},
	"IN": {Name: "India", Region: "Asia"},
	"IT": {Name: "Italy", Region: "Europe"},
	"JP": {Name: "Japan", Region: "Asia"},
	"KE": {Name: "Kenya", Region: "Africa"},
	"KR": {Name: "South Korea", Region: "Asia"},
	"MA": {Name: "Morocco", Region: "Africa"},
	"MX": {Name: "Mexico", Region: "Americas"},
	"NG": {Name: "Nigeria", Region: "Africa"},
	"NL": {Name: "Netherlands", Region: "Europe"},
	"NO": {Name: "Norway", Region: "Europe"},
	"NZ": {Name: "New Zealand", Region: "Oceania"},
	"PL": {Name: "Poland", Region: "Europe"},
	"PT": {Name: "Portugal", Region: "Europe"},
	"SE": {Name: "Sweden", Region: "Europe"},
	"SG": {Name: "Singapore", Region: "Asia"},
	"US": {Name: "United States", Region: "Americas"},
	"VN": {Name: "Viet Nam", Region: "Asia"},
	"ZA": {Name: "South Africa", Region: "Africa"},
}

// fakeAPI is a third-party enrichment API served on loopback:
// GET /v1/countries/{code} answers a country as JSON, or 404. It enforces
// its own limit with a fakesite.Site, which also counts what it saw.
type fakeAPI struct {
	URL  string         // http://127.0.0.1:PORT, without a trailing slash
	Site *fakesite.Site // the limit and the counts

	srv    *http.Server
	served chan struct{} // closed when Serve has returned
}

// startAPI serves a fakeAPI on a free loopback port. It answers at most
// limit requests per client in any interval of length window, and 429
// with a Retry-After of window (in whole seconds, rounded up) past that.
// The caller must Close it.
func startAPI(limit int, window time.Duration) (*fakeAPI, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/countries/{code}", serveCountry)
	site := fakesite.New(fakesite.Config{Limit: limit, Window: window, RetryAfter: window, Handler: mux})
	a := &fakeAPI{
		URL:    "http://" + ln.Addr().String(),
		Site:   site,
		srv:    &http.Server{Handler: site, ReadHeaderTimeout: 5 * time.Second},
		served: make(chan struct{}),
	}
	go func() {
		defer close(a.served)
		_ = a.srv.Serve(ln) // always http.ErrServerClosed, after Close
	}()
	return a, nil
}

// Close stops the API at once, closing its connections, and waits until
// it has stopped serving.
func (a *fakeAPI) Close() error {
	err := a.srv.Close()
	<-a.served
	return err
}

func serveCountry(w http.ResponseWriter, r *http.Request) {
	code := strings.ToUpper(r.PathValue("code"))
	c, ok := countries[code]
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":"unknown country code"}` + "\n"))
		return
	}
	c.Code = code
	_ = json.NewEncoder(w).Encode(c)
}
