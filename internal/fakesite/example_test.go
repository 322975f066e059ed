package fakesite_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/fleetgate/fleetgate/internal/fakesite"
)

func Example() {
	site := fakesite.New(fakesite.Config{Limit: 2, Window: time.Minute, Ban: true})
	srv := httptest.NewServer(site)
	defer srv.Close()

	for range 4 {
		resp, err := http.Get(srv.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	st := site.Stats()
	fmt.Printf("requests=%d ok=%d banned=%d bans=%d peak=%d\n", st.Requests, st.OK, st.Banned, st.Bans, st.Peak)
	// Output:
	// 200
	// 200
	// 403
	// 403
	// requests=4 ok=2 banned=2 bans=1 peak=4
}
