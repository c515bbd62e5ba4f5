package pglocks_test

import (
	"fmt"

	"github.com/pglocks/pglocks"
)

func ExampleKeyOf() {
	k := pglocks.KeyOf("report:monthly")
	fmt.Println(k.Int64())
	fmt.Println("select pg_try_advisory_lock(" + k.SQL() + ")")
	// Output:
	// -6377036543226593914
	// select pg_try_advisory_lock(hashtextextended('report:monthly', 0))
}

func ExamplePairKey() {
	k := pglocks.PairKey(7, 42)
	hi, lo, _ := k.Pair()
	fmt.Println(k, k.Space(), hi, lo)
	fmt.Println("select pg_try_advisory_lock(" + k.SQL() + ")")
	// Output:
	// (7,42) int32pair 7 42
	// select pg_try_advisory_lock(7, 42)
}

func ExampleNamespace() {
	billing, err := pglocks.NewNamespace("billing")
	if err != nil {
		panic(err)
	}
	fmt.Println(billing.Name("invoice:42"))
	fmt.Println(billing.Key("invoice:42") == pglocks.KeyOf("billing:invoice:42"))
	// Output:
	// billing:invoice:42
	// true
}

func ExampleKey_Validate() {
	err := pglocks.KeyOf("bad\x00name").Validate()
	fmt.Println(err)
	// Output: pglocks: invalid key: name "bad\x00name" contains a NUL byte, which PostgreSQL text cannot hold
}
