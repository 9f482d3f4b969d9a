package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	vcs := []debug.BuildSetting{
		{Key: "vcs.revision", Value: "3b2af53c1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b"},
		{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	for _, tc := range []struct {
		name  string
		stamp string
		bi    *debug.BuildInfo
		want  string
	}{
		{"nothing known", "", nil, "omnipd dev"},
		{"a devel build without VCS", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, "omnipd dev (go1.26.8)"},
		{"a pseudo-version and VCS", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261201100000-3b2af53c1e0f+dirty"}, Settings: vcs},
			"omnipd v0.0.0-20261201100000-3b2af53c1e0f+dirty (revision 3b2af53c1e0f, 2026-12-01T10:00:00Z, modified; go1.26.8)"},
		{"a stamped version wins", "v1.2.3", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-x"}}, "omnipd v1.2.3 (go1.26.8)"},
		{"installed at a tag", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.4.0"}}, "omnipd v0.4.0"},
	} {
		if got := fromBuildInfo(tc.stamp, tc.bi).String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestRelease(t *testing.T) {
	for _, tc := range []struct {
		version string
		release bool
	}{
		{"v0.4.0", true},
		{"v1.2.3-rc.1", true},
		{"1.2.3", true},
		{"dev", false},
		{"", false},
		{"v0.0.0-20261201100000-3b2af53c1e0f", false},
		{"v0.4.1-0.20261201100000-3b2af53c1e0f", false},
		{"v0.5.0-rc.1.0.20261201100000-3b2af53c1e0f", false},
		{"v0.4.0+dirty", false},
		{"v0.0.0-20261201100000-3b2af53c1e0f+dirty", false},
		{"v2.0.0+incompatible", false},
	} {
		if got := (Info{Version: tc.version}).Release(); got != tc.release {
			t.Errorf("Info{Version: %q}.Release() = %v, want %v", tc.version, got, tc.release)
		}
	}
}
