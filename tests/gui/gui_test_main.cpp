// GoogleTest main for the GUI suites: a Qt application object (QGuiApplication for the GUI-less
// suite, QApplication for the widgets), offscreen unless told otherwise, and settings kept away from
// the user's own and from the other test processes: ctest runs each test in its own process, two at
// a time, and a settings file shared between them (recent files) made one test see the other's.
#include <gtest/gtest.h>

#include <QSettings>
#include <QStandardPaths>
#include <QTemporaryDir>
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
  const QTemporaryDir settings_dir;  // this process's settings, removed at exit
  QSettings::setDefaultFormat(QSettings::IniFormat);
  QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, settings_dir.path());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
