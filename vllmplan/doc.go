// Package vllmplan renders how a deploy config runs on GPU engines: the
// shell plan (launch.sh) that starts a stock vllm serve instance per
// Thinker replica of a text pipeline, or omnipd's vllm-omni stage worker
// (python3 -m omnipd_stage) per replica of every stage of a pipeline with a
// Talker; each instance's flags, environment, --kv-transfer-config and
// --ec-transfer-config; the vllm-omni deploy config the stage workers read;
// and the omnipd config whose endpoints name the planned instances, for
// omnipd serve to drive them.
//
// It is pure: it starts and contacts nothing. omnipd plan prints its plans,
// package kube renders the same instances as Kubernetes objects, and omnipd
// serve gives its reference workers the EC config it renders
// (ECTransferJSON). Starting reference workers is package launch's.
package vllmplan
