package nilsafe_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"
)

// A receiver kind: a nil pointer (pointer-receiver methods only: a value
// method called through a nil pointer panics in Go itself) or a pointer to
// the zero value (every method).
const (
	nilPointer = "nil"
	zeroValue  = "zero"
)

// TestMethods calls every exported method of every exported type on a nil
// receiver and on the zero value, with zero arguments.
func TestMethods(t *testing.T) {
	t.Parallel()
	for name, typ := range types {
		if typ.Kind() == reflect.Interface || typ.Kind() == reflect.Func {
			continue // nothing to call: an interface's methods are its implementations'
		}
		if why := skipped[name]; why != "" {
			t.Logf("%s left out: %s", name, why)
			continue
		}
		ptr := reflect.PointerTo(typ)
		for i := range ptr.NumMethod() {
			m := ptr.Method(i)
			_, valueMethod := typ.MethodByName(m.Name)
			kinds := []string{zeroValue}
			if !valueMethod {
				kinds = append(kinds, nilPointer)
			}
			for _, kind := range kinds {
				recv := reflect.New(typ)
				if kind == nilPointer {
					recv = reflect.Zero(ptr)
				}
				what := fmt.Sprintf("(%s %s).%s", kind, name, m.Name)
				check(t, what, recv.Method(i), kind == nilPointer || (typ.Kind() == reflect.Struct && !valueMethod))
			}
		}
	}
}

// TestFunctions calls every exported function with zero arguments.
func TestFunctions(t *testing.T) {
	t.Parallel()
	for name, fn := range funcs {
		check(t, name+"(zero arguments)", reflect.ValueOf(fn), true)
	}
}

// check calls fn with zero arguments and judges what it returns: no panic,
// an answer within a bound, an error where one can be returned (unless
// wantErr is false, or okNil excuses it), and neither a nil context nor a
// nil channel, which would panic or block the caller for good.
func check(t *testing.T, what string, fn reflect.Value, wantErr bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type result struct {
		out []reflect.Value
		p   any
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{p: p}
			}
		}()
		done <- result{out: fn.Call(zeroArgs(ctx, fn.Type()))}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s: no answer within 10s", what)
		return
	}
	if r.p != nil {
		t.Errorf("%s: panic: %v", what, r.p)
		return
	}
	for _, v := range r.out {
		judge(t, what, v, wantErr)
	}
}

var errorType = reflect.TypeFor[error]()

// judge checks one result of a call.
func judge(t *testing.T, what string, v reflect.Value, wantErr bool) {
	t.Helper()
	switch {
	case v.Type() == errorType:
		switch err, _ := v.Interface().(error); {
		case err == nil && wantErr && okNil[what] == "":
			t.Errorf("%s: nil error", what)
		case err != nil:
			t.Logf("%s: %v", what, err)
		}
	case v.Type() == reflect.TypeFor[context.Context]():
		ctx, _ := v.Interface().(context.Context)
		if ctx == nil {
			t.Errorf("%s: nil context", what)
		} else if wantErr && ctx.Err() == nil {
			t.Errorf("%s: a live context", what)
		}
	case v.Kind() == reflect.Chan && v.IsNil():
		t.Errorf("%s: nil channel (a receive blocks for good)", what)
	}
}

// zeroArgs returns the zero value of each parameter of ft, except: a live
// ctx for a context, a recorder and a request for an HTTP handler's
// arguments, and one zero element for a variadic parameter.
func zeroArgs(ctx context.Context, ft reflect.Type) []reflect.Value {
	var args []reflect.Value
	for i := range ft.NumIn() {
		in := ft.In(i)
		if ft.IsVariadic() && i == ft.NumIn()-1 {
			in = in.Elem()
		}
		switch in {
		case reflect.TypeFor[context.Context]():
			args = append(args, reflect.ValueOf(ctx))
		case reflect.TypeFor[http.ResponseWriter]():
			args = append(args, reflect.ValueOf(httptest.NewRecorder()))
		case reflect.TypeFor[*http.Request]():
			args = append(args, reflect.ValueOf(httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)))
		default:
			args = append(args, reflect.Zero(in))
		}
	}
	return args
}
