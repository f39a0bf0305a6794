// The reduction loops for the avx512 instruction set (compile flags set in CMakeLists.txt).
#define RZ_ISA_NS isa_avx512
#define RZ_TABLE_FN reduce_table_avx512
#include "reduce_kernels.inc"
