// GoogleTest main for the GUI suites: a Qt application object (QGuiApplication for the GUI-less
// suite, QApplication for the widgets), offscreen unless told otherwise, and settings kept away from
// the user's own.
#include <gtest/gtest.h>

#include <QStandardPaths>
#ifdef ORRERY_GUI_TEST_GUILESS
#include <QGuiApplication>
using App = QGuiApplication;
#else
#include <QApplication>
using App = QApplication;
#endif

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QStandardPaths::setTestModeEnabled(true);
  App app(argc, argv);
  QCoreApplication::setOrganizationName("orrery-tests");
  QCoreApplication::setApplicationName("orrery-gui-tests");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
