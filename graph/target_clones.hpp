#pragma once
/// \file target_clones.hpp
/// AG_AVX2_CLONES: on a function (not a template: clang does not clone
/// templates), builds it for AVX2 and for the baseline on x86-64, picked at
/// run time by an ifunc resolver. Empty elsewhere and under the sanitizers,
/// whose runtimes need not be up when an ifunc resolver runs. AVX2 alone
/// has no fused multiply-add, so both clones round alike.

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer) && !__has_feature(thread_sanitizer) && !__has_feature(memory_sanitizer)
#define AG_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#else
#define AG_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef AG_AVX2_CLONES
#define AG_AVX2_CLONES
#endif
