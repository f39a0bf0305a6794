// The Adam loops for the avx2 instruction set (compile flags set in CMakeLists.txt).
#define RZ_ISA_NS adam_avx2
#define RZ_TABLE_FN adam_table_avx2
#include "adam_kernels.inc"
