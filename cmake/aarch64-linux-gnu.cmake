# Cross build for 64-bit ARM Linux with Debian's g++-aarch64-linux-gnu:
#   cmake -S . -B build-arm/build -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#     -DPAGELLM_ARM_SYSROOT=$PWD/build-arm/sysroot
# PAGELLM_ARM_SYSROOT holds the arm64 Debian packages of the libraries
# (tests/arm/sysroot.sh unpacks them there without installing anything), and
# is also the runtime root for qemu-aarch64-static -L. `make arm-test` does it all.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(PAGELLM_ARM_SYSROOT "" CACHE PATH "Unpacked arm64 Debian packages (tests/arm/sysroot.sh)")
# try_compile projects read this file again: hand them the sysroot.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES PAGELLM_ARM_SYSROOT)
if(PAGELLM_ARM_SYSROOT)
  set(CMAKE_FIND_ROOT_PATH ${PAGELLM_ARM_SYSROOT})
  set(_lib ${PAGELLM_ARM_SYSROOT}/usr/lib/aarch64-linux-gnu)
  # After the cross compiler's own headers: the sysroot holds library headers only.
  set(CMAKE_CXX_FLAGS_INIT "-idirafter ${PAGELLM_ARM_SYSROOT}/usr/include -idirafter ${PAGELLM_ARM_SYSROOT}/usr/include/aarch64-linux-gnu")
  set(CMAKE_C_FLAGS_INIT "${CMAKE_CXX_FLAGS_INIT}")
  # Shared libraries' own dependencies (spdlog's libfmt, ...) resolve at link time there.
  # (zlib and libc sit in lib/, the rest in usr/lib/.)
  foreach(kind EXE SHARED MODULE)
    set(CMAKE_${kind}_LINKER_FLAGS_INIT
      "-L${_lib} -Wl,-rpath-link,${_lib} -Wl,-rpath-link,${PAGELLM_ARM_SYSROOT}/lib/aarch64-linux-gnu")
  endforeach()
  set(ENV{PKG_CONFIG_SYSROOT_DIR} ${PAGELLM_ARM_SYSROOT})
  set(ENV{PKG_CONFIG_LIBDIR} "${_lib}/pkgconfig:${PAGELLM_ARM_SYSROOT}/usr/share/pkgconfig")
  set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L ${PAGELLM_ARM_SYSROOT})
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
