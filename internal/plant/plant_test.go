package plant

import "testing"

func TestSet(t *testing.T) {
	if On(GuardSkipsCheck) || On(AsyncCommit) {
		t.Fatal("a bug is planted before Set")
	}
	Set(AsyncCommit)
	if On(GuardSkipsCheck) || !On(AsyncCommit) {
		t.Fatal("Set planted the wrong bug")
	}
	if Names["guard-skips-check"] != GuardSkipsCheck {
		t.Fatal("Names")
	}
}
