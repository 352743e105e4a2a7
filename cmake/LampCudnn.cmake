# lamp_find_cudnn_headers(): where cuDNN's headers are, for the fused
# BatchNorm + ReLU kernels (src/ops/cudnn_batch_norm.cpp). Only headers:
# lamp calls the libcudnn that LibTorch loads, so it links nothing of cuDNN.
#
# Looked for, in order: LAMP_CUDNN_INCLUDE_DIR (a cache variable; set it to
# choose), the nvidia-cudnn wheel beside a torch wheel
# (<site-packages>/nvidia/cudnn/include), LibTorch's own include folder, and
# the CUDA toolkit's and the system's.
#
# Sets in the caller's scope:
#   LAMP_CUDNN_FOUND        ON when cudnn.h was found
#   LAMP_CUDNN_INCLUDE_DIR  its folder (cached)
function(lamp_find_cudnn_headers)
  get_filename_component(_torch_parent "${TORCH_INSTALL_PREFIX}" DIRECTORY)
  find_path(LAMP_CUDNN_INCLUDE_DIR cudnn.h
    HINTS "${_torch_parent}/nvidia/cudnn/include"
          "${TORCH_INSTALL_PREFIX}/include"
          "${CUDNN_INCLUDE_PATH}"
          ENV CUDNN_INCLUDE_DIR
    PATHS /usr/local/cuda/include /usr/include
    DOC "Folder of cuDNN's cudnn.h, for lamp's fused BatchNorm + ReLU")
  if(LAMP_CUDNN_INCLUDE_DIR)
    set(LAMP_CUDNN_FOUND ON PARENT_SCOPE)
    message(STATUS "lamp: cuDNN headers at ${LAMP_CUDNN_INCLUDE_DIR}: fused BatchNorm + ReLU on")
  else()
    set(LAMP_CUDNN_FOUND OFF PARENT_SCOPE)
    message(STATUS "lamp: cuDNN headers not found: fused BatchNorm + ReLU off "
                   "(set LAMP_CUDNN_INCLUDE_DIR to cudnn.h's folder to build it)")
  endif()
endfunction()

# lamp_find_cudnn_frontend_headers(): where cudnn-frontend's headers are
# (header-only C++; cudnn_frontend.h), for BatchNorm folded into the
# convolutions through cuDNN's graph API (src/ops/conv_batch_norm_cudnn.cpp).
# PyPI's nvidia-cudnn-frontend wheel ships them: installed beside a torch
# wheel they are in <site-packages>/include, where this looks first
# (scripts/test.sh --torch wheel installs it there, without its Python
# dependencies). Set LAMP_CUDNN_FRONTEND_INCLUDE_DIR to choose.
#
# Sets in the caller's scope:
#   LAMP_CUDNN_FRONTEND_FOUND        ON when cudnn_frontend.h was found
#   LAMP_CUDNN_FRONTEND_INCLUDE_DIR  its folder (cached)
function(lamp_find_cudnn_frontend_headers)
  get_filename_component(_torch_parent "${TORCH_INSTALL_PREFIX}" DIRECTORY)
  find_path(LAMP_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
    HINTS "${_torch_parent}/include"
          "${_torch_parent}/cudnn/include"
          ENV CUDNN_FRONTEND_INCLUDE_DIR
    PATHS /usr/local/include /usr/include
    DOC "Folder of cudnn-frontend's cudnn_frontend.h, for BatchNorm folded into the convolutions")
  if(LAMP_CUDNN_FRONTEND_INCLUDE_DIR)
    set(LAMP_CUDNN_FRONTEND_FOUND ON PARENT_SCOPE)
    message(STATUS "lamp: cudnn-frontend at ${LAMP_CUDNN_FRONTEND_INCLUDE_DIR}: BatchNorm folded into the convolutions available (--fused-bn conv)")
  else()
    set(LAMP_CUDNN_FRONTEND_FOUND OFF PARENT_SCOPE)
    message(STATUS "lamp: cudnn-frontend not found: --fused-bn conv runs the ATen reference "
                   "(pip install nvidia-cudnn-frontend beside torch, or set "
                   "LAMP_CUDNN_FRONTEND_INCLUDE_DIR to cudnn_frontend.h's folder)")
  endif()
endfunction()
