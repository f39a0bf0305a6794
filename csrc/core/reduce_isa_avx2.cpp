// The reduction loops for the avx2 instruction set (compile flags set in CMakeLists.txt).
#define RZ_ISA_NS isa_avx2
#define RZ_TABLE_FN reduce_table_avx2
#include "reduce_kernels.inc"
