#pragma once
// All layers in one include.
#include "nn/modules/basic.h"
#include "nn/modules/batch_norm.h"
#include "nn/modules/conv.h"
#include "nn/modules/dropout.h"
#include "nn/modules/layer_norm.h"
#include "nn/modules/linear.h"
#include "nn/modules/module.h"
#include "nn/modules/multihead_attention.h"
#include "nn/modules/pooling.h"
#include "nn/modules/sequential.h"
#include "nn/modules/stochastic_depth.h"
