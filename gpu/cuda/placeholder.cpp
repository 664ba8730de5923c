void ag_cuda_placeholder() {}
