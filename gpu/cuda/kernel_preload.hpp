#pragma once
// Loading every kernel of the backend into a GPU's context when its devices
// are made, instead of on first launch (CUDA's lazy loading, the default
// since CUDA 12.2).
//
// Why: loading a module may synchronise the whole context. A kernel that
// waits on the GPU for another device's kernel (an in-stream all-reduce part,
// in_stream.cuh) then deadlocks against a host thread that is loading the
// kernel the other device needs next: two logical devices of one GPU share
// one context, so the load waits for the spinning part and the part waits
// for the kernel behind the load (on an H100, the first job of a 1 x 2
// tensor-parallel plan on cuda:0,0 timed out in most runs with lazy loading,
// never with CUDA_MODULE_LOADING=EAGER or with every own kernel loaded
// first; docs/BENCHMARKS.md, session 14). It also takes the load off the
// first job's latency.
//
// Each .cu file with kernels registers one anchor kernel
// (AG_CUDA_MODULE_ANCHOR in common.cuh); its module is found from it and
// every function of that module is loaded (cuFuncLoad). Only the project's
// own kernels: cuBLAS loads its own, lazily.

#include <string>

#include "graph/error.hpp"

namespace ag::gpu::cuda {

/// Called by AG_CUDA_MODULE_ANCHOR at static initialisation; returns true.
bool register_module_anchor(const void* kernel) noexcept;

/// Loads every registered module's functions into the current device's
/// context (the caller sets the device). Safe to call again: loading a
/// loaded function does nothing. Does nothing on drivers without cuFuncLoad
/// (before CUDA 12.4). An error names the call that failed.
error preload_kernels(const std::string& where);

}  // namespace ag::gpu::cuda
