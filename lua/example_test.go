package lua_test

import (
	"fmt"
	"strings"

	"github.com/fleetgate/fleetgate/lua"
)

// The script is plain text; throttle.RedisStore runs it with EVALSHA.
func Example() {
	header, _, _ := strings.Cut(lua.SlidingLog, "\n")
	fmt.Println(header)
	fmt.Println(strings.Contains(lua.SlidingLog, "call('TIME')"))
	// Output:
	// -- fleetgate sliding-window log.
	// true
}
