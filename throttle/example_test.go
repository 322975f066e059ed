package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetgate/fleetgate/throttle"
)

func Example() {
	rules, err := throttle.ParseRules("api.example.com=2/1s", "*=10/1s")
	if err != nil {
		panic(err)
	}
	t, err := throttle.New(rules, throttle.WithMargin(0))
	if err != nil {
		panic(err)
	}
	defer t.Close()

	ctx := context.Background()
	for range 3 {
		d, _ := t.Allow(ctx, "api.example.com")
		fmt.Println(d.Allowed, d.Remaining)
	}

	// Wait would block for about a second here; a short deadline fails fast.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	err = t.Wait(ctx, "api.example.com:443")
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	// Output:
	// true 1
	// true 0
	// false 0
	// true
}
