package nilsafe_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/gocronleader"
	"github.com/pglocks/pglocks/gocronlock"
	"github.com/pglocks/pglocks/gooselock"
	"github.com/pglocks/pglocks/health"
	"github.com/pglocks/pglocks/httplock"
	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/otelpglocks"
	"github.com/pglocks/pglocks/schedule"
	"github.com/pglocks/pglocks/shard"
	"github.com/pglocks/pglocks/singleflight"
	"github.com/pglocks/pglocks/stdsql"
)

// packages are the module's public packages under test, by the label used
// in the names below, with their directories. Left out: pgtest, the test
// harness, whose values come only from constructors that fail the test
// rather than return nil; cmd and examples (programs); internal/.
var packages = map[string]string{
	"pglocks":      "../..",
	"advisory":     "../../advisory",
	"lease":        "../../lease",
	"leader":       "../../leader",
	"shard":        "../../shard",
	"httplock":     "../../httplock",
	"singleflight": "../../singleflight",
	"stdsql":       "../../stdsql",
	"health":       "../../health",
	"otelpglocks":  "../../otelpglocks",
	"gooselock":    "../../gooselock",
	"gocronleader": "../../gocronleader",
	"schedule":     "../../schedule",
	"gocronlock":   "../../gocronlock",
}

// types are the exported types of the packages.
var types = map[string]reflect.Type{
	"pglocks.AcquireEvent":  reflect.TypeFor[pglocks.AcquireEvent](),
	"pglocks.EndEvent":      reflect.TypeFor[pglocks.EndEvent](),
	"pglocks.HoldEvent":     reflect.TypeFor[pglocks.HoldEvent](),
	"pglocks.Key":           reflect.TypeFor[pglocks.Key](),
	"pglocks.Kind":          reflect.TypeFor[pglocks.Kind](),
	"pglocks.LeaderEvent":   reflect.TypeFor[pglocks.LeaderEvent](),
	"pglocks.Namespace":     reflect.TypeFor[pglocks.Namespace](),
	"pglocks.Observer":      reflect.TypeFor[pglocks.Observer](),
	"pglocks.Reason":        reflect.TypeFor[pglocks.Reason](),
	"pglocks.RenewEvent":    reflect.TypeFor[pglocks.RenewEvent](),
	"pglocks.Result":        reflect.TypeFor[pglocks.Result](),
	"pglocks.Space":         reflect.TypeFor[pglocks.Space](),
	"advisory.Config":       reflect.TypeFor[advisory.Config](),
	"advisory.Holder":       reflect.TypeFor[advisory.Holder](),
	"advisory.Lock":         reflect.TypeFor[advisory.Lock](),
	"advisory.Locks":        reflect.TypeFor[advisory.Locks](),
	"advisory.Permit":       reflect.TypeFor[advisory.Permit](),
	"advisory.Permits":      reflect.TypeFor[advisory.Permits](),
	"advisory.Semaphore":    reflect.TypeFor[advisory.Semaphore](),
	"advisory.Locker":       reflect.TypeFor[advisory.Locker](),
	"advisory.Querier":      reflect.TypeFor[advisory.Querier](),
	"lease.Config":          reflect.TypeFor[lease.Config](),
	"lease.Handle":          reflect.TypeFor[lease.Handle](),
	"lease.HeldError":       reflect.TypeFor[lease.HeldError](),
	"lease.HeldAllError":    reflect.TypeFor[lease.HeldAllError](),
	"lease.FullError":       reflect.TypeFor[lease.FullError](),
	"lease.Semaphore":       reflect.TypeFor[lease.Semaphore](),
	"lease.Permits":         reflect.TypeFor[lease.Permits](),
	"lease.Info":            reflect.TypeFor[lease.Info](),
	"lease.Lease":           reflect.TypeFor[lease.Lease](),
	"lease.Option":          reflect.TypeFor[lease.Option](),
	"lease.RegressionError": reflect.TypeFor[lease.RegressionError](),
	"lease.Store":           reflect.TypeFor[lease.Store](),
	"leader.Candidate":      reflect.TypeFor[leader.Candidate](),
	"leader.Config":         reflect.TypeFor[leader.Config](),
	"leader.Elector":        reflect.TypeFor[leader.Elector](),
	"leader.Leader":         reflect.TypeFor[leader.Leader](),
	"leader.Mode":           reflect.TypeFor[leader.Mode](),
	"leader.State":          reflect.TypeFor[leader.State](),
	"leader.Term":           reflect.TypeFor[leader.Term](),
	"shard.Config":          reflect.TypeFor[shard.Config](),
	"shard.Member":          reflect.TypeFor[shard.Member](),
	"shard.Shard":           reflect.TypeFor[shard.Shard](),
	"httplock.BusyError":    reflect.TypeFor[httplock.BusyError](),
	"httplock.Config":       reflect.TypeFor[httplock.Config](),
	"httplock.Held":         reflect.TypeFor[httplock.Held](),
	"httplock.Source":       reflect.TypeFor[httplock.Source](),
	"singleflight.Group":    reflect.TypeFor[singleflight.Group](),
	"singleflight.Results":  reflect.TypeFor[singleflight.Results](),
	"singleflight.Source":   reflect.TypeFor[singleflight.Source](),
	"singleflight.Table":    reflect.TypeFor[singleflight.Table](),
	"health.Checker":        reflect.TypeFor[health.Checker](),
	"otelpglocks.Option":    reflect.TypeFor[otelpglocks.Option](),
	"gooselock.Locker":      reflect.TypeFor[gooselock.Locker](),
	"gocronleader.Elector":  reflect.TypeFor[gocronleader.Elector](),
	"schedule.Config":       reflect.TypeFor[schedule.Config](),
	"schedule.Job":          reflect.TypeFor[schedule.Job](),
	"schedule.Outcome":      reflect.TypeFor[schedule.Outcome](),
	"schedule.Policy":       reflect.TypeFor[schedule.Policy](),
	"schedule.Record":       reflect.TypeFor[schedule.Record](),
	"schedule.Run":          reflect.TypeFor[schedule.Run](),
	"schedule.Runner":       reflect.TypeFor[schedule.Runner](),
	"schedule.TakenError":   reflect.TypeFor[schedule.TakenError](),
	"gocronlock.Locker":     reflect.TypeFor[gocronlock.Locker](),
	"gocronlock.Lock":       reflect.TypeFor[gocronlock.Lock](),
}

// funcs are the exported functions of the packages.
var funcs = map[string]any{
	"pglocks.ValidateName":          pglocks.ValidateName,
	"pglocks.Int64Key":              pglocks.Int64Key,
	"pglocks.KeyOf":                 pglocks.KeyOf,
	"pglocks.PairKey":               pglocks.PairKey,
	"pglocks.NewNamespace":          pglocks.NewNamespace,
	"advisory.New":                  advisory.New,
	"advisory.IsHeld":               advisory.IsHeld,
	"advisory.Holders":              advisory.Holders,
	"advisory.SemaphorePermits":     advisory.SemaphorePermits,
	"advisory.SlotKey":              advisory.SlotKey,
	"advisory.TurnstileKey":         advisory.TurnstileKey,
	"advisory.TryXactLock":          advisory.TryXactLock,
	"advisory.TryXactRLock":         advisory.TryXactRLock,
	"advisory.XactLock":             advisory.XactLock,
	"advisory.XactRLock":            advisory.XactRLock,
	"advisory.SessionLock":          advisory.SessionLock,
	"advisory.TrySessionLock":       advisory.TrySessionLock,
	"advisory.SessionUnlock":        advisory.SessionUnlock,
	"lease.New":                     lease.New,
	"lease.SchemaSQL":               lease.SchemaSQL,
	"lease.ParseHandle":             lease.ParseHandle,
	"lease.WithKeepAlive":           lease.WithKeepAlive,
	"lease.WithMaxHold":             lease.WithMaxHold,
	"lease.WithMetadata":            lease.WithMetadata,
	"lease.WithOwner":               lease.WithOwner,
	"leader.New":                    leader.New,
	"leader.Candidates":             leader.Candidates,
	"leader.RequestResign":          leader.RequestResign,
	"leader.RequestHandOver":        leader.RequestHandOver,
	"shard.New":                     shard.New,
	"httplock.New":                  httplock.New,
	"httplock.Advisory":             httplock.Advisory,
	"httplock.Lease":                httplock.Lease,
	"singleflight.NewTable":         singleflight.NewTable,
	"stdsql.Guard":                  stdsql.Guard,
	"stdsql.GuardTerm":              stdsql.GuardTerm,
	"stdsql.TryXactLock":            stdsql.TryXactLock,
	"stdsql.XactLock":               stdsql.XactLock,
	"stdsql.Tx":                     stdsql.Tx,
	"stdsql.SessionLock":            stdsql.SessionLock,
	"stdsql.TrySessionLock":         stdsql.TrySessionLock,
	"stdsql.SessionUnlock":          stdsql.SessionUnlock,
	"gooselock.New":                 gooselock.New,
	"gocronleader.Start":            gocronleader.Start,
	"health.Handler":                health.Handler,
	"health.Ready":                  health.Ready,
	"otelpglocks.New":               otelpglocks.New,
	"otelpglocks.WithAttributes":    otelpglocks.WithAttributes,
	"otelpglocks.WithMeterProvider": otelpglocks.WithMeterProvider,
	"otelpglocks.WithNames":         otelpglocks.WithNames,
	"schedule.New":                  schedule.New,
	"schedule.SchemaSQL":            schedule.SchemaSQL,
	"schedule.SlotKey":              schedule.SlotKey,
	"gocronlock.New":                gocronlock.New,
}

// okNil excuses a nil error where zero input is valid, with the reason.
var okNil = map[string]string{
	"(nil httplock.BusyError).Unwrap":    "Unwrap of nothing is nil, as errors.Unwrap says",
	"(zero httplock.BusyError).Unwrap":   "Unwrap of nothing is nil, as errors.Unwrap says",
	"lease.SchemaSQL(zero arguments)":    "the zero Config is the default table's",
	"otelpglocks.New(zero arguments)":    "no options: the global MeterProvider",
	"schedule.SchemaSQL(zero arguments)": "the zero Config is the default table's",
	"(zero schedule.Policy).Validate":    "the zero Policy is valid (for explicit slot keys)",
}

// skipped types are left out of TestMethods, with the reason.
var skipped = map[string]string{}

// TestListsComplete: the lists above name every exported type and function
// of the packages, as their source declares them, so that a new one is
// tested too.
func TestListsComplete(t *testing.T) {
	t.Parallel()
	declared := map[string]bool{}
	for label, dir := range packages {
		for _, d := range exported(t, dir) {
			declared[label+"."+d.name] = true
			_, isType := types[label+"."+d.name]
			_, isFunc := funcs[label+"."+d.name]
			if (d.isType && !isType) || (!d.isType && !isFunc) {
				t.Errorf("%s.%s is exported but not in this test's lists", label, d.name)
			}
		}
	}
	for name := range types {
		if !declared[name] {
			t.Errorf("type %s is listed but not declared", name)
		}
	}
	for name := range funcs {
		if !declared[name] {
			t.Errorf("function %s is listed but not declared", name)
		}
	}
}

// decl is an exported top-level type or function.
type decl struct {
	name   string
	isType bool
}

// exported returns the exported types and functions declared by the Go
// files (tests left out) of dir.
func exported(t *testing.T, dir string) []decl {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []decl
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					out = append(out, decl{name: d.Name.Name})
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.IsExported() {
						out = append(out, decl{name: ts.Name.Name, isType: true})
					}
				}
			}
		}
	}
	return out
}
